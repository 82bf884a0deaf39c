"""Section ``same_folder`` of benchmarks/faults.py: a second training run on a busy ``run.output_dir`` (same config,
another arm) and two launched at once: the second exits 1 naming the holder and writes nothing; the first, SIGKILLed
and resumed, ends equal to an uninterrupted run.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

from ._common import (
    PAUSE_ENV,
    PAUSE_LINE,
    Tally,
    _free_port,
    _resume_to_end,
    _start,
    _stop,
    _train_reference,
    _two_rank_cmd,
    _wait_text,
    run,
    train_cmd,
)

OUTCOME = (
    "the second run on a folder exits 1 naming the holder (PID, host, since) and writes nothing; a killed "
    "holder releases it; the first run ends equal to an uninterrupted one"
)


def section_same_folder(t: Tally, work: Path, model: Path, store: Path) -> None:
    """Two training runs on one run.output_dir: the second exits 1 naming the holder; nothing of the first is lost."""
    ref = _train_reference(work, model, store)
    for name, extra in (("the same config", []), ("another arm (run.arm=text)", ["run.arm=text"])):
        out = work / f"concurrent-{len(extra)}"
        log = work / f"concurrent-{len(extra)}-first.log"
        first = _start(train_cmd(out, model, store), log, {PAUSE_ENV: "1800@4"})  # held at checkpoint-4 until killed
        problem = ""
        try:
            if not _wait_text(first, log, PAUSE_LINE):
                problem = f"the first run never reached checkpoint-4: {log.read_text()[-300:]}"
            else:
                ids = (out / "sample_ids.rank0.txt").read_bytes()
                second = run(train_cmd(out, model, store, *extra), 300)
                named = f"(pid {first.pid} on host " in second.stderr and str(out) in second.stderr
                if second.returncode != 1 or not named:
                    problem = f"second run rc={second.returncode}, holder named: {named}: {second.stderr[-300:]}"
                elif (out / "sample_ids.rank0.txt").read_bytes() != ids:
                    problem = "the refused run wrote into the first run's sample_ids.rank0.txt"
                elif json.loads((out / "tokenswap_config.json").read_text())["run"]["arm"] != "tokenswap":
                    problem = "the refused run rewrote tokenswap_config.json"
        finally:
            _stop(first)  # SIGKILL: the lock must not outlive it
        problem = problem or _resume_to_end(out, model, store, ref)
        t.add("same_folder", f"second run with {name} while the first trains: exit 1 naming the holder; the first "
              "(killed, resumed) ends equal to an uninterrupted run", not problem, problem)
    # A 2-rank launch refused: rank 0 holds the answer, every rank must exit (none left waiting at a collective).
    out = work / "concurrent-2rank"
    log = work / "concurrent-2rank-first.log"
    first = _start(train_cmd(out, model, store), log, {PAUSE_ENV: "1800@2"})  # held until killed
    problem = ""
    try:
        if not _wait_text(first, log, PAUSE_LINE):
            problem = f"the first run never reached checkpoint-2: {log.read_text()[-300:]}"
        else:
            t0 = time.monotonic()
            second = run(_two_rank_cmd(out, model, store, _free_port()), 300)
            named = f"(pid {first.pid} on host " in second.stderr
            # A rank left waiting at a collective is what rc 124 (run's 300 s hang guard) catches; the time taken
            # is said, not judged (a loaded machine starts 3 processes of torch slowly).
            if second.returncode in (0, 124) or not named:
                problem = (f"2-rank launch rc={second.returncode} after {time.monotonic() - t0:.0f}s, holder named: "
                           f"{named}: {second.stderr[-300:]}")
    finally:
        _stop(first)
    problem = problem or _resume_to_end(out, model, store, ref)
    t.add("same_folder", "a 2-rank launch on a busy folder: every rank exits (rc 1) naming the holder, none hangs",
          not problem, problem)
    # Both launched at the same moment: whichever locks first trains, the other is refused. The holder waits at
    # checkpoint-2 until it is killed, so the two overlap whatever the load (a fixed pause there used to decide it).
    out = work / "concurrent-race"
    logs = [work / f"concurrent-race-{i}.log" for i in range(2)]
    procs = [_start(train_cmd(out, model, store), logs[i], {PAUSE_ENV: "1800@2"}) for i in range(2)]
    problem = ""
    try:
        deadline = time.monotonic() + 900  # a hang guard: the refused run ends long before
        while all(p.poll() is None for p in procs) and time.monotonic() < deadline:
            time.sleep(0.05)
        ended = [i for i, p in enumerate(procs) if p.poll() is not None]
        if len(ended) != 1:
            problem = f"{len(ended)} of the 2 runs ended (exit codes {[p.poll() for p in procs]})"
        elif procs[ended[0]].returncode != 1:
            problem = f"the first to end exited {procs[ended[0]].returncode}: {logs[ended[0]].read_text()[-300:]}"
        else:
            holder = procs[1 - ended[0]].pid
            if f"(pid {holder} on host " not in logs[ended[0]].read_text():
                problem = f"the refused run does not name pid {holder}: {logs[ended[0]].read_text()[-300:]}"
    finally:
        for p in procs:
            _stop(p)  # SIGKILL of the holder: the lock must not outlive it
    problem = problem or _resume_to_end(out, model, store, ref)
    t.add("same_folder", "two identical runs launched together: one trains (killed while holding the folder, then "
          "resumed: equal to an uninterrupted run), the other exits 1 naming it", not problem, problem)
