"""Section ``runs_end`` of benchmarks/faults.py: a finished run with persistent data-loader workers ends with them;
SIGTERM to the job's process group before the first batch (``TOKENSWAP_FAULT_WORKER_HOLD_S`` holds each worker there
until the signal is pending) saves step 1 and exits 143 with no traceback and no orphan; a SIGKILL of a run with 2
workers leaves the folder's lock free at the first try; a SIGKILLed ``atomic_write``'s temporary is removed when the
training run and the store build restart (a live writer's is kept); a write on a full tmpfs leaves none.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from tests.support import process_group_left

from ._common import (
    ENV,
    PAUSE_ENV,
    PAUSE_LINE,
    PY,
    REPO,
    Tally,
    _resume_to_end,
    _train_reference,
    _wait_text,
    compare_logs,
    llm_build_files,
    run,
    store_cmd,
    train_cmd,
)

OUTCOME = (
    "persistent workers: the run ends (exit 0) with no worker left; the job's SIGTERM before the first batch: exit 143 "
    "after saving step 1, no traceback, no orphan, exact resume; SIGKILL with workers: the folder's lock free at the "
    "first try; dead writers' temporaries removed when a run or build restarts (live ones kept), a failed write none"
)


WORKER_HOLD_ENV = "TOKENSWAP_FAULT_WORKER_HOLD_S"  # tokenswap.training.workers.FAULT_WORKER_HOLD_ENV
WORKER_HOLD_LINE = "waits for a SIGTERM before its first batch"


def _start_job(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """A run in its own process group, as a scheduler's job: ``os.killpg`` reaches it and all its workers."""
    with open(log, "w") as f:
        return subprocess.Popen(cmd, cwd=REPO, env={**ENV, **(env or {})}, stdout=f, stderr=subprocess.STDOUT,
                                start_new_session=True)


def _end_job(p: subprocess.Popen, hang_s: float = 600) -> str:
    """Wait for the job's main process ('' once it exited), or kill the group and say it hung."""
    try:
        p.wait(timeout=hang_s)
        return ""
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()
        return f"still running {hang_s:g}s later (hung)"


def _holds(pid: int, path: Path) -> bool:
    """Whether process ``pid`` has ``path`` open, by inode (the lock was opened under its tagged temporary's name)."""
    try:
        want = os.stat(path)
        fds = os.listdir(f"/proc/{pid}/fd")
    except FileNotFoundError:
        return False
    for fd in fds:
        with contextlib.suppress(FileNotFoundError):
            there = os.stat(f"/proc/{pid}/fd/{fd}")
            if (there.st_dev, there.st_ino) == (want.st_dev, want.st_ino):
                return True
    return False


def _children(pid: int) -> list[int]:
    kids = []
    for task in os.listdir(f"/proc/{pid}/task"):
        with open(f"/proc/{pid}/task/{task}/children") as f:
            kids += [int(k) for k in f.read().split()]
    return kids


_PAUSED_WRITER = ("import os, signal, sys\n"
                  "from tokenswap.files import atomic_write\n"
                  "os.fsync = lambda fd: signal.pause()  # holds the write between its temporary and the rename\n"
                  "atomic_write(sys.argv[1], b'{}')\n")


def _writer_at(path: Path) -> tuple[subprocess.Popen, Path]:
    """A process in the middle of ``atomic_write(path)`` (its temporary written, not yet renamed), and the temporary."""
    before = set(path.parent.glob(f"{path.name}.*.tmp"))
    p = subprocess.Popen([PY, "-c", _PAUSED_WRITER, str(path)], cwd=REPO, env=ENV, stderr=subprocess.DEVNULL)
    while p.poll() is None:
        new = set(path.parent.glob(f"{path.name}.*.tmp")) - before
        if new:
            return p, new.pop()
        time.sleep(0.005)
    raise RuntimeError(f"the paused writer of {path} exited {p.returncode} before writing its temporary")


def _dead_and_live_temporaries(dead_of: Path, live_of: Path) -> tuple[Path, Path, subprocess.Popen]:
    """A temporary of a writer SIGKILLed mid-write beside ``dead_of``, and a live writer's beside ``live_of``."""
    killed, dead = _writer_at(dead_of)
    killed.kill()
    killed.wait()
    live_writer, live = _writer_at(live_of)
    return dead, live, live_writer


# The trials of the section, in order; ``--sections runs_end:NAME+NAME`` runs some of them (the CI subset runs one).
TRIALS = ("persistent", "sigterm_start", "sigkill", "temporaries", "full_disk")


def section_runs_end(t: Tally, work: Path, model: Path, store: Path, trials: tuple[str, ...] = TRIALS) -> None:
    """Runs end, with their workers, and free their folder; what dead writers left is removed at the restart.

    ``trials``: which of :data:`TRIALS` to run (``--sections runs_end:sigkill`` runs one).
    """
    from tokenswap.files import FolderLock, atomic_write

    ref = _train_reference(work, model, store) if {"sigterm_start", "sigkill", "temporaries"} & set(trials) else {}
    workers = "train.dataloader_num_workers=2"

    if "persistent" in trials:
        # A finished run with persistent workers: "done", then the process ends with its workers (it used to live on,
        # holding the folder, waiting for workers that ignore SIGTERM).
        out, log = work / "end-persistent", work / "end-persistent.log"
        p = _start_job(train_cmd(out, model, store, workers, "train.dataloader_persistent_workers=true", steps=4), log)
        problem = _end_job(p)
        done_at = log.stat().st_mtime
        left = process_group_left(p.pid)
        said = log.read_text(errors="replace")
        if not problem and (p.returncode != 0 or f"done: {out}" not in said):
            problem = f"rc={p.returncode}: {said[-300:]}"
        problem = problem or (f"{len(left)} worker(s) left after the run ended: {left}" if left else "")
        t.add("runs_end", "a finished run with train.dataloader_persistent_workers=true ends with its workers (exit 0, "
              f"{max(0.0, time.time() - done_at):.1f}s after its last line, no process of its group left)", not problem,
              problem)

    if "sigterm_start" in trials:
        # The whole job SIGTERMed as the workers start: each worker holds its first batch until the signal is pending.
        out, log = work / "end-sigterm-start", work / "end-sigterm-start.log"
        p = _start_job(train_cmd(out, model, store, workers), log, {WORKER_HOLD_ENV: "300"})
        problem = "" if _wait_text(p, log, WORKER_HOLD_LINE) else f"no worker started: {log.read_text()[-300:]}"
        if not problem:
            os.killpg(p.pid, signal.SIGTERM)
        problem = problem or _end_job(p)
        said = log.read_text(errors="replace")
        left = process_group_left(p.pid)
        if not problem:
            if p.returncode != 143 or "Traceback" in said:
                problem = f"rc={p.returncode}: {said[-400:]}"
            elif left:
                problem = f"{len(left)} orphan(s) left: {left}"
            elif not (out / "checkpoint-1" / "tokenswap_complete.json").is_file():
                problem = "no complete checkpoint-1"
        problem = problem or _resume_to_end(out, model, store, ref)
        t.add("runs_end", "SIGTERM to the job's process group before the first batch: step 1 saved, exit 143, no "
              "traceback, no orphan; the resume equals an uninterrupted run", not problem, problem)

    if "sigkill" in trials:
        # SIGKILL of a run whose workers are serving batches: the next run gets the folder at its first try.
        out, log = work / "end-sigkill", work / "end-sigkill.log"
        p = _start_job(train_cmd(out, model, store, workers), log, {PAUSE_ENV: "300@2"})
        problem, orphans = "", []
        try:
            if not _wait_text(p, log, PAUSE_LINE):
                problem = f"the run never reached checkpoint-2: {log.read_text()[-300:]}"
            else:
                kids = _children(p.pid)
                holding = [k for k in kids if _holds(k, out / ".train-lock-r000")]
                if not _holds(p.pid, out / ".train-lock-r000"):
                    problem = "the run does not hold its folder's lock file: the check below would see nothing"
                p.kill()
                p.wait()
                try:
                    FolderLock(out, 0, prefix=".train-lock").acquire().release()
                except RuntimeError as e:
                    problem = f"the lock was still held right after the SIGKILL: {e}"
                orphans = [k for k in kids if os.path.exists(f"/proc/{k}")]
                if len(kids) < 2:
                    problem = problem or f"{len(kids)} worker(s) found, expected 2"
                elif holding:
                    problem = problem or f"worker(s) {holding} hold a descriptor of the lock file"
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        problem = problem or _resume_to_end(out, model, store, ref)
        t.add("runs_end", f"SIGKILL of a run with 2 workers: the lock is free at the first try ({len(orphans)} orphaned "
              "worker(s) still alive then), the resume equals an uninterrupted run", not problem, problem)

    if "temporaries" in trials:
        # Dead writers' temporaries: a writer SIGKILLed between its temporary and the rename, and a live one. The
        # restarted run (its folder) and the restarted build (its folder) remove the dead one and keep the live one.
        out = work / "end-sigkill"  # complete now (resumed to the end)
        if not (out / "log_history.json").exists():  # the sigkill trial was not run: a finished run of its own
            proc = run(train_cmd(out, model, store, workers), 1800)
            if proc.returncode:
                raise RuntimeError(f"the run the temporaries are planted in failed: {proc.stderr[-300:]}")
        older, newest = sorted(out.glob("checkpoint-*"), key=lambda c: int(c.name.split("-")[1]))[-2:]
        dead, live, writer = _dead_and_live_temporaries(older / "tokenswap_state.rank0.json",
                                                        newest / "tokenswap_state.rank0.json")
        try:
            proc = run(train_cmd(out, model, store, "train.resume_from_checkpoint=latest"), 1800)
            problem = f"rc={proc.returncode}: {proc.stderr[-300:]}" if proc.returncode else ""
            problem = problem or ("the dead writer's temporary is still there" if dead.exists() else "")
            problem = problem or ("the live writer's temporary was removed" if not live.exists() else "")
            problem = problem or compare_logs(out, ref)
        finally:
            writer.kill()
            writer.wait()
        t.add("runs_end", "a training run restarted over a SIGKILLed writer's temporary removes it (a live writer's is "
              "kept) and ends equal to an uninterrupted run", not problem, problem)

        build = work / "end-build"
        proc = run(store_cmd(build, "data.max_samples=20"), 1800)
        problem = f"build rc={proc.returncode}: {proc.stderr[-300:]}" if proc.returncode else ""
        if not problem:
            before = llm_build_files(build)
            dead, live, writer = _dead_and_live_temporaries(build / "state" / "plan.json", build / "report.json")
            try:
                proc = run(store_cmd(build, "data.max_samples=20"), 1800)
                problem = f"rerun rc={proc.returncode}: {proc.stderr[-300:]}" if proc.returncode else ""
                problem = problem or ("the dead writer's temporary is still there" if dead.exists() else "")
                problem = problem or ("the live writer's temporary was removed" if not live.exists() else "")
                after = {k: v for k, v in llm_build_files(build).items() if not k.endswith(".tmp")}
                problem = problem or ("" if after == before else f"files changed: {sorted(set(after) ^ set(before))[:4]}")
            finally:
                writer.kill()
                writer.wait()
        t.add("runs_end", "a store build restarted over a SIGKILLed writer's temporary removes it (a live writer's is "
              "kept), the build unchanged", not problem, problem)

    if "full_disk" in trials:
        # A write that fails (a full disk) leaves no temporary: a real ENOSPC on a small tmpfs.
        disk = work / "end-full-disk"
        disk.mkdir(exist_ok=True)
        mounted = os.geteuid() == 0 and shutil.which("mount") and subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(disk)], capture_output=True).returncode == 0
        if not mounted:
            t.note("runs_end", "the full-disk write was not tried: it needs root and mount -t tmpfs")
            return
        try:
            try:
                atomic_write(disk / "big.json", b"x" * (1 << 20))
                problem = "a 1 MiB write into 256 KiB succeeded"
            except OSError as e:
                problem = "" if e.errno == 28 else f"{type(e).__name__}: {e}"
            left = [p.name for p in disk.iterdir()]
            problem = problem or (f"left behind: {left}" if left else "")
        finally:
            subprocess.run(["umount", str(disk)], check=False)
        t.add("runs_end", "atomic_write on a full disk: ENOSPC raised, no temporary left", not problem, problem)
