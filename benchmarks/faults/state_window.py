"""Section ``state_window`` of benchmarks/faults.py: SIGKILLs held precisely between ``trainer_state.json`` and
tokenswap's record (``TOKENSWAP_FAULT_SAVE_PAUSE_S``): the cut checkpoint is skipped (said) and the run ends equal
to the reference.
"""

from __future__ import annotations

from pathlib import Path

from ._common import (
    PAUSE_ENV,
    PAUSE_LINE,
    Tally,
    _start,
    _stop,
    _train_reference,
    _wait_text,
    compare_logs,
    run,
    train_cmd,
)

OUTCOME = (
    "a checkpoint killed after trainer_state.json, before tokenswap's record: skipped on resume (said); "
    "losses, sample_ids and swap_stats equal an uninterrupted run"
)


def section_state_window(t: Tally, work: Path, model: Path, store: Path) -> None:
    """SIGKILL after the Trainer wrote checkpoint-N (trainer_state.json included), before tokenswap's record."""
    from tokenswap.training import COMPLETE_MARKER

    ref = _train_reference(work, model, store)
    out = work / "state-window"
    kills = []
    problem = ""
    for step in (2, 6, 10):
        resume = ["train.resume_from_checkpoint=latest"] if out.exists() else []
        log = work / f"state-window-{step}.log"
        p = _start(train_cmd(out, model, store, *resume), log, {PAUSE_ENV: f"120@{step}"})
        hit = _wait_text(p, log, f"checkpoint-{step} {PAUSE_LINE}")
        _stop(p)
        cut = out / f"checkpoint-{step}"
        in_window = (hit and (cut / "trainer_state.json").is_file() and not (cut / COMPLETE_MARKER).exists()
                     and not (cut / "tokenswap_state.rank0.json").exists())
        kills.append((step, in_window, log))
        if resume and f"checkpoint-{step - 4} is incomplete (no {COMPLETE_MARKER}" not in log.read_text():
            problem = problem or f"the resume before the kill at {step} did not say it skipped checkpoint-{step - 4}"
    final = run(train_cmd(out, model, store, "train.resume_from_checkpoint=latest"), 600)
    if final.returncode != 0:
        problem = problem or f"final resume rc={final.returncode}: {final.stderr[-400:]}"
    else:
        if f"checkpoint-10 is incomplete (no {COMPLETE_MARKER}" not in final.stdout:
            problem = problem or "the final resume did not say it skipped checkpoint-10"
        problem = "; ".join(filter(None, [problem, compare_logs(out, ref)]))  # what a silent resume lost, too
    for step, in_window, log in kills:
        why = problem if in_window else f"the kill missed the window: {log.read_text()[-300:]}"
        t.add("state_window", f"SIGKILL after checkpoint-{step}/trainer_state.json, before tokenswap's state: "
              "skipped on resume (said), the run ends equal to an uninterrupted one", in_window and not problem, why)
