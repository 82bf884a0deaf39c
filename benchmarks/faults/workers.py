"""Section ``workers`` of benchmarks/faults.py: the tiny post-training run with ``train.dataloader_num_workers=2``
(also stopped after its first checkpoint and resumed): losses, ``sample_ids.rank0.txt``, ``swap_stats.json`` and
each checkpoint's collator state must equal the run with 0 workers.
"""

from __future__ import annotations

import json
from pathlib import Path

from ._common import CACHE_COUNTERS, Tally, run, run_logs, train_cmd

OUTCOME = (
    "dataloader_num_workers=2, also stopped and resumed: losses, sample_ids, swap_stats and the checkpoints' "
    "collator state equal a run with 0 workers"
)


def _collator_state(out: Path, step: int) -> dict | None:
    """The collator state checkpoint-``step`` resumes from, without the pixel-cache counters."""
    try:
        state = json.loads((out / f"checkpoint-{step}" / "tokenswap_state.rank0.json").read_text())["collator"]
    except (OSError, ValueError, KeyError) as e:
        return {"unreadable": str(e)}
    if state is None:
        return None
    return {"log_bytes": state.get("log_bytes"),
            "stats": {k: v for k, v in state.get("stats", {}).items() if k not in CACHE_COUNTERS}}


def section_workers(t: Tally, work: Path, model: Path, store: Path) -> None:
    """Collation in 2 data-loader worker processes: the bookkeeping must equal a run with 0 workers."""
    steps = ["train.max_steps=4", "train.save_steps=2"]
    runs = {}
    for name, workers in (("workers-0", 0), ("workers-2", 2)):
        out = runs[name] = work / name
        proc = run(train_cmd(out, model, store, *steps, f"train.dataloader_num_workers={workers}"), 600)
        if proc.returncode != 0:
            raise RuntimeError(f"{name} run failed (rc={proc.returncode}): {proc.stderr[-1000:]}")
    # Stopped after checkpoint-2 (the workers had collated batches ahead of it), then resumed, with 2 workers.
    out = runs["workers-2, stopped at checkpoint-2 and resumed"] = work / "workers-2-resumed"
    for extra in (["train.max_steps=2"], ["train.resume_from_checkpoint=latest"]):
        proc = run(train_cmd(out, model, store, *steps, "train.dataloader_num_workers=2", *extra), 600)
        if proc.returncode != 0:
            raise RuntimeError(f"resumed workers run failed (rc={proc.returncode}): {proc.stderr[-1000:]}")
    ref_out = runs.pop("workers-0")
    ref = run_logs(ref_out)
    for name, out in runs.items():
        try:
            got = run_logs(out)
        except (OSError, ValueError, KeyError) as e:
            t.add("workers", f"dataloader_num_workers=2 ({name}): run logs", False, f"unreadable: {e}")
            continue
        close = [s for s, _ in got["losses"]] == [s for s, _ in ref["losses"]] and all(
            abs(a - b) <= 1e-5 * max(1.0, abs(b)) for (_, a), (_, b) in zip(got["losses"], ref["losses"]))
        t.add("workers", f"{name}: losses equal to 0 workers", close, f"{got['losses']} vs {ref['losses']}")
        t.add("workers", f"{name}: sample_ids.rank0.txt equal to 0 workers", got["sample_ids"] == ref["sample_ids"],
              f"{len(got['sample_ids'])} lines vs {len(ref['sample_ids'])}")
        a, b = ({k: v for k, v in d["swap_stats"].items() if k not in CACHE_COUNTERS} for d in (got, ref))
        t.add("workers", f"{name}: swap_stats.json equal to 0 workers", a == b,
              f"{len(a)} keys vs {len(b)}; differ: {sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))[:6]}")
        states = [(_collator_state(out, s), _collator_state(ref_out, s)) for s in (2, 4)]
        t.add("workers", f"{name}: checkpoint collator state equal to 0 workers", all(x == y for x, y in states),
              f"checkpoint-2: {states[0][0]} vs {states[0][1]}"[:300])
