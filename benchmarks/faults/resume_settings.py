"""Section ``resume_settings`` of benchmarks/faults.py: resumes with changed ``run.arm``, ``collator.swap_prob``,
``data.seed``, ``collator.max_length``, ``collator.pack_budget``, batch size, learning rate: exit 2 naming each
difference, the folder untouched; a longer ``max_steps`` with 2 workers resumes exactly.
"""

from __future__ import annotations

from pathlib import Path

from ._common import Tally, _train_reference, compare_logs, run, train_cmd, tree_digest

OUTCOME = (
    "changed run.arm / swap_prob / data.seed / max_length / pack_budget / batch size / lr: exit 2 naming "
    "each (was/now), folder untouched; max_steps and workers may change"
)


CHANGED_SETTINGS = {
    "run.arm=text": "run.arm: was 'tokenswap', now 'text'",
    "collator.swap_prob=0.5": "collator.swap_prob: was 1.0, now 0.5",
    "data.seed=1": "data.seed: was 0, now 1",
    "collator.max_length=256": "collator.max_length: was 512, now 256",
    "collator.pack_budget=8192": "collator.pack_budget: was 16384, now 8192",
    "train.per_device_train_batch_size=2": "train.per_device_train_batch_size: was 4, now 2",
    "train.learning_rate=0.01": "train.learning_rate: was 0.001, now 0.01",
}


def section_resume_settings(t: Tally, work: Path, model: Path, store: Path) -> None:
    """A resume with settings that change the sample stream or bookkeeping: exit 2 naming each, folder untouched."""
    ref = _train_reference(work, model, store)
    out = work / "resume-settings"
    proc = run(train_cmd(out, model, store, steps=4), 600)
    if proc.returncode != 0:
        raise RuntimeError(f"first part failed: {proc.stderr[-1000:]}")
    before = tree_digest(out)
    for override, difference in CHANGED_SETTINGS.items():
        proc = run(train_cmd(out, model, store, "train.resume_from_checkpoint=latest", override), 300)
        ok = proc.returncode == 2 and difference in proc.stderr and tree_digest(out) == before
        t.add("resume_settings", f"resume with {override}: exit 2 naming it (was/now), folder untouched", ok,
              f"rc={proc.returncode}, folder unchanged: {tree_digest(out) == before}: {proc.stderr[-300:]}")
    # what may change does: the run extended to 16 steps, other logging, 2 workers
    proc = run(train_cmd(out, model, store, "train.resume_from_checkpoint=latest", "train.logging_steps=1",
                         "train.dataloader_num_workers=2"), 600)
    problem = f"rc={proc.returncode}: {proc.stderr[-300:]}" if proc.returncode else compare_logs(out, ref)
    t.add("resume_settings", "resume with max_steps 4 -> 16 and 2 dataloader workers (allowed): equals an "
          "uninterrupted run", not problem, problem)
