"""Compare the arms of paired runs: a markdown table, a plot, and optionally a W&B report.

Runs are read from wherever they were logged:

- a recipe output folder (``log_history.json`` + ``tokenswap_config.json`` written by every recipe);
- ``wandb:ENTITY/PROJECT/GROUP`` through the W&B API (online runs of one pair).

A W&B offline run (``wandb/offline-run-*``) is not read: its ``.wandb`` file is W&B's private record log. The
recipe's output folder beside it holds the same history in ``log_history.json``; W&B runs are compared in W&B
(``wandb sync``, then ``wandb:ENTITY/PROJECT/GROUP`` or ``--wandb-report``).

Runs with the same arm are treated as seeds: the table gives mean ± 95% CI across them (exact
Student-t, :mod:`tokenswap.eval.stats`). Paired arms share seeds, so their difference is estimated
per seed (``tokenswap − text`` of the same seed) with its own CI, which is narrower than the two
arms' CIs combined when the seeds' noise is shared. A run whose log is empty (a crashed or
unfinished run) is left out and listed under ``skipped``; it never counts as a seed.
"""

from __future__ import annotations

import glob
import json
import math
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from tokenswap.errors import InputError
from tokenswap.eval.stats import mean_ci
from tokenswap.files import atomic_write_figure, atomic_write_json, atomic_write_text, read_json
from tokenswap.inputs import local_or_hub, require_output_dir
from tokenswap.script import CommandParser

__all__ = ["RunRecord", "compare_runs", "load_run", "make_wandb_report", "mean_ci", "paired_difference",
           "read_trainer_run", "seed_of"]

DEFAULT_METRICS = ("loss", "gap/acc_text", "gap/acc_interleaved", "gap/abs", "gap/rel", "gap/retention",
                   "perf/tokens_per_s", "perf/padding", "perf/mfu")
ARM_ORDER = ("baseline", "text", "tokenswap")


@dataclass
class RunRecord:
    """One logged run: its name, pair (group), arm, config and per-step history."""

    name: str
    group: str
    arm: str
    config: dict = field(default_factory=dict)
    history: list[dict] = field(default_factory=list)
    source: str = ""
    """Where the history was read from, for messages (``training log '/runs/a/log_history.json'``)."""

    def series(self, metric: str) -> tuple[list[float], list[float]]:
        """``(steps, values)`` of ``metric`` over the rows that log it.

        Raises:
            InputError: a logged value or step that is no number (names the row of :attr:`source`).
        """
        steps, values = [], []
        for index, row in enumerate(self.history):
            if metric in row and row[metric] is not None:
                step = row.get("step", row.get("_step", len(steps)))
                for key, value in ((metric, row[metric]), ("step", step)):
                    if isinstance(value, bool) or not isinstance(value, (int, float)):
                        raise InputError(f"{self.source or self.name} row {index}: `{key}` must be a number, got "
                                         f"{value!r}; fix the file, or leave the folder out of --runs")
                steps.append(step)
                values.append(float(row[metric]))
        return steps, values

    def last(self, metric: str) -> float | None:
        _, values = self.series(metric)
        return values[-1] if values else None


# ---------------------------------------------------------------------------- readers
def read_trainer_run(output_dir: str | os.PathLike) -> RunRecord:
    """Read a recipe output folder (``log_history.json`` + ``tokenswap_config.json``)."""
    out = Path(output_dir)
    log = out / "log_history.json"
    if not log.exists():
        raise FileNotFoundError(f"{out}: no log_history.json (written by the recipes when training ends)")
    fix = "the run did not finish writing it (killed?): rerun or resume the run, or leave the folder out of --runs"
    if log.is_dir():
        raise InputError(f"training log {str(log)!r} is a folder, not a file; {fix}")
    config = read_json(out / "tokenswap_config.json", "run config", fix) if (out / "tokenswap_config.json").exists() else {}
    if not isinstance(config, dict):
        raise InputError(f"run config {str(out / 'tokenswap_config.json')!r} is a JSON {type(config).__name__}, "
                         f"not an object; {fix}")
    # An empty file is a run that crashed before its first log line: no history (compare skips it).
    history = read_json(log, "training log", fix) if log.read_bytes().strip() else []
    if not isinstance(history, list):
        raise InputError(f"training log {str(log)!r} is not a JSON list of log rows; {fix}")
    for index, row in enumerate(history):
        if not isinstance(row, dict):
            raise InputError(f"training log {str(log)!r} row {index} is a JSON {type(row).__name__}, not an object "
                             f"(a log row); {fix}")
    where = f"run config {str(out / 'tokenswap_config.json')!r}"
    run = config.get("run", {})
    if not isinstance(run, dict):
        raise InputError(f"{where}: `run` must be an object, got {type(run).__name__}; {fix}")
    for key, kind in (("arm", str), ("pair", str), ("seed", int)):
        value = run.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, kind)):
            raise InputError(f"{where}: `run.{key}` must be {'an integer' if kind is int else 'a string'}, got "
                             f"{value!r}; {fix}")
    return RunRecord(
        name=f"{run.get('pair', out.name)}-{run.get('arm', '?')}",
        group=run.get("pair", ""),
        arm=run.get("arm", "?"),
        config=config,
        history=history,
        source=f"training log {str(log)!r}",
    )


def read_wandb_api(spec: str) -> list[RunRecord]:
    """``ENTITY/PROJECT/GROUP`` -> the runs of that group through the W&B API (needs a login)."""
    import wandb

    entity, project, group = spec.split("/", 2)
    runs = wandb.Api().runs(f"{entity}/{project}", filters={"group": group})
    out = []
    for r in runs:
        history = [dict(row, step=row.get("train/global_step", row.get("_step"))) for row in r.scan_history()]
        history = [{(k[len("train/"):] if k.startswith("train/") else k): v for k, v in row.items()} for row in history]
        out.append(RunRecord(name=r.name, group=group, arm=str(r.config.get("arm", "?")), config=dict(r.config),
                             history=history))
    return out


def load_run(spec: str) -> list[RunRecord]:
    """Dispatch on what ``spec`` points at (see module docstring)."""
    if spec.startswith("wandb:"):
        return read_wandb_api(spec[len("wandb:"):])
    local_or_hub(spec, "--runs", "a run folder holds log_history.json (a recipe's output_dir); or pass "
                 "wandb:ENTITY/PROJECT/GROUP", hub=False)
    p = Path(spec)
    if (p / "log_history.json").exists():
        return [read_trainer_run(p)]
    if p.suffix == ".wandb" or glob.glob(str(p / "run-*.wandb")) or glob.glob(str(p / "wandb" / "offline-run-*")):
        raise InputError(
            f"{spec}: a W&B offline run, which compare does not read (W&B's own record format); pass the recipe's "
            "output folder (it holds the same history in log_history.json), or compare W&B runs in W&B "
            "(`wandb sync` the run, then --runs wandb:ENTITY/PROJECT/GROUP)")
    raise FileNotFoundError(f"{spec}: not a recipe output folder (log_history.json), or wandb:ENTITY/PROJECT/GROUP")


# ---------------------------------------------------------------------------- comparison
def seed_of(run: RunRecord) -> int | None:
    """The run's seed: ``run.seed`` of a recipe's config (also how the recipes' W&B config nests it)."""
    section = run.config.get("run")
    seed = section.get("seed") if isinstance(section, dict) else run.config.get("seed")
    return None if seed is None else int(seed)


def paired_difference(runs: list[RunRecord], metric: str, base: str = "text", other: str = "tokenswap") -> dict:
    """``other − base`` of the final ``metric`` per seed (same group), mean ± 95% Student-t CI.

    Returns:
        ``{"n", "mean", "ci95", "values", "seeds"}``; ``n`` is 0 when no seed has both arms.

    Raises:
        ValueError: a run of either arm has no seed in its config, or one seed has two runs of an arm.
    """
    finals: dict[str, dict[tuple[str, int], float]] = {base: {}, other: {}}
    for r in runs:
        if r.arm not in finals or not r.history:
            continue
        seed = seed_of(r)
        if seed is None:
            raise ValueError(f"run {r.name!r} ({r.arm}) has no run.seed in its config; runs are paired by seed")
        key = (r.group, seed)
        if key in finals[r.arm]:
            raise ValueError(f"two {r.arm} runs for group {r.group!r} seed {seed}; pass each run once")
        value = r.last(metric)
        if value is not None:
            finals[r.arm][key] = value
    keys = sorted(set(finals[base]) & set(finals[other]))
    values = [finals[other][k] - finals[base][k] for k in keys]
    if not values:
        return {"n": 0, "mean": math.nan, "ci95": math.nan, "values": [], "seeds": []}
    mean, ci = mean_ci(values)
    return {"n": len(values), "mean": mean, "ci95": ci, "values": values, "seeds": [k[1] for k in keys]}


# Keys naming where a run wrote or what it was called, not what it trained: runs differing only here (and in run.seed,
# when the seed reached neither the order nor the swaps) are one replicate written twice.
_NOT_SETTINGS = {"output_dir", "logging_dir", "run_name", "seed", "_wandb", "wandb"}
_OUTCOMES = ("loss", "grad_norm", "gap/", "swap/", "eval")


def _settings(config: dict) -> str:
    def strip(d):
        if not isinstance(d, dict):
            return d
        return {k: strip(v) for k, v in d.items() if k not in _NOT_SETTINGS}

    return json.dumps(strip(config), sort_keys=True, default=str)


def same_replicates(runs: list[RunRecord]) -> list[list[RunRecord]]:
    """Runs of one arm grouped by replicate: same pair, same settings (its config less output folders and the seed)
    and the same logged losses, gap and swap counts, i.e. the same data order, swap decisions and init. A group of more than one run
    is one replicate counted several times (a seed that reached nothing random: data.seed and
    collator.swap_seed fixed on a full fine-tune)."""
    groups: dict[tuple, list[RunRecord]] = {}
    for r in runs:
        # What training and evaluation produced (timings left out: they differ between two copies of one run).
        logged = [{k: v for k, v in row.items() if k.startswith(_OUTCOMES)} for row in r.history]
        key = (r.arm, r.group, _settings(r.config), json.dumps(logged, sort_keys=True, default=str))
        groups.setdefault(key, []).append(r)
    return list(groups.values())


def compare_runs(
    runs: list[RunRecord],
    metrics: tuple[str, ...] = DEFAULT_METRICS,
    pairs: tuple[tuple[str, str], ...] = (("text", "tokenswap"),),
) -> dict:
    """Final value of each metric per arm, mean ± 95% CI over the runs (seeds) of an arm.

    Args:
        runs: the runs; those with an empty log are skipped (listed under ``skipped``).
        metrics: metric names (as logged, e.g. ``gap/abs``).
        pairs: ``(base, other)`` arms whose per-seed difference ``other − base`` is reported when
            both arms are present.

    Returns:
        ``{"arms": {arm: {"n": int, metric: {"mean", "ci95", "values"}}}, "metrics": [...],
        "paired": {"other-base": {metric: paired_difference(...)}}, "skipped": [names],
        "same_replicate": [[names]]}``: ``n`` counts distinct replicates; runs of one arm that are one replicate
        (:func:`same_replicates`) count once, and each such set is listed. A statistic with nothing to rest on (an
        interval over one replicate) is ``None``.
    """
    by_arm: dict[str, list[RunRecord]] = defaultdict(list)
    skipped = []
    for r in runs:
        if not r.history:
            skipped.append(r.name)
            continue
        by_arm[r.arm].append(r)
    duplicates = []
    for arm in by_arm:
        sets = same_replicates(by_arm[arm])
        duplicates += [[r.source or r.name for r in same] for same in sets if len(same) > 1]
        by_arm[arm] = [same[0] for same in sets]
    arms = sorted(by_arm, key=lambda a: (ARM_ORDER.index(a) if a in ARM_ORDER else len(ARM_ORDER), a))
    table: dict = {"arms": {}, "metrics": list(metrics)}
    for arm in arms:
        row: dict = {"n": len(by_arm[arm]), "runs": [r.name for r in by_arm[arm]]}
        for m in metrics:
            values = [v for r in by_arm[arm] if (v := r.last(m)) is not None]
            if values:
                mean, ci = mean_ci(values)
                row[m] = {"mean": mean, "ci95": ci, "values": values}
        table["arms"][arm] = row
    table["paired"] = {}
    for base, other in pairs:
        if base in by_arm and other in by_arm:
            kept = by_arm[base] + by_arm[other]
            table["paired"][f"{other}-{base}"] = {m: paired_difference(kept, m, base, other) for m in metrics}
    table["skipped"] = skipped
    table["same_replicate"] = duplicates
    return _no_nan(table)


def _no_nan(value):
    """NaN (no interval over one run, no paired seed) as None: comparison.json stays JSON (``null``)."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {k: _no_nan(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_no_nan(v) for v in value]
    return value


def _missing(x) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


def to_markdown(table: dict) -> str:
    metrics = table["metrics"]
    lines = ["| arm | runs | " + " | ".join(metrics) + " |", "|---|---|" + "---|" * len(metrics)]
    for arm, row in table["arms"].items():
        cells = []
        for m in metrics:
            if m not in row:
                cells.append("—")
            elif _missing(row[m]["ci95"]):
                cells.append(f"{row[m]['mean']:.4f}")
            else:
                cells.append(f"{row[m]['mean']:.4f} ± {row[m]['ci95']:.4f}")
        lines.append(f"| {arm} | {row['n']} | " + " | ".join(cells) + " |")
    for name, diffs in table.get("paired", {}).items():
        cells = []
        for m in metrics:
            d = diffs.get(m)
            if not d or not d["n"]:
                cells.append("—")
            elif _missing(d["ci95"]):
                cells.append(f"{d['mean']:+.4f}")
            else:
                cells.append(f"{d['mean']:+.4f} ± {d['ci95']:.4f}")
        n = max((d["n"] for d in diffs.values()), default=0)
        lines.append(f"| paired {name} (per seed) | {n} | " + " | ".join(cells) + " |")
    lines.append("\nruns: distinct replicates per arm; ± is the 95% CI over them (none with one replicate); paired: "
                 "per seed present in both arms.")
    for names in table.get("same_replicate", []):
        lines.append(f"Counted once: {len(names)} runs are one replicate (same order, swaps, settings and logged "
                     f"results; run.seed reached nothing random): {', '.join(names)}. Vary run.seed with data.seed "
                     "and collator.swap_seed unset for another replicate (docs/training.md, Replicates).")
    if table.get("skipped"):
        lines.append(f"\nSkipped (empty log): {', '.join(table['skipped'])}")
    return "\n".join(lines) + "\n"


def plot_runs(runs: list[RunRecord], metrics: tuple[str, ...], path: str | os.PathLike) -> None:
    """One panel per metric over steps; one colour per arm, one line per run."""
    from matplotlib.figure import Figure

    present = [m for m in metrics if any(r.series(m)[1] for r in runs)]
    cols = min(3, max(1, len(present)))
    rows = math.ceil(max(1, len(present)) / cols)
    fig = Figure(figsize=(4.4 * cols, 3.3 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    colors = {"baseline": "tab:gray", "text": "tab:blue", "tokenswap": "tab:orange"}
    for ax in axes.flat[len(present):]:
        ax.axis("off")
    for ax, m in zip(axes.flat, present):
        seen = set()
        for r in runs:
            steps, values = r.series(m)
            if not values:
                continue
            label = r.arm if r.arm not in seen else None
            seen.add(r.arm)
            ax.plot(steps, values, color=colors.get(r.arm, "tab:green"), alpha=0.8, label=label, marker="." if len(values) < 20 else None)
        ax.set_title(m)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    if present:
        axes.flat[0].legend()
    fig.tight_layout()
    atomic_write_figure(path, fig, dpi=120)


def make_wandb_report(entity: str, project: str, group: str, metrics: tuple[str, ...] = DEFAULT_METRICS, title: str | None = None):
    """A W&B report (``wandb-workspaces``) whose panels put the arms of ``group`` side by side.

    Returns the unsaved ``Report``; call ``.save()`` to publish it (needs a login).
    """
    try:
        import wandb_workspaces.reports.v2 as wr
    except ImportError as e:
        raise ImportError("--wandb-report needs `pip install wandb-workspaces` (extra: tokenswap[report])") from e

    runset = wr.Runset(entity=entity, project=project, name=group, filters=f"Config('pair') == '{group}'",
                       groupby=["arm"])
    # The recipes log to W&B under the log_history names (tokenswap.training.tracking.same_keys_in_wandb).
    panels = [wr.LinePlot(title=m, x="Step", y=[m], groupby="arm") for m in metrics]
    return wr.Report(
        entity=entity,
        project=project,
        title=title or f"TokenSwap pair {group}",
        description="Paired arms (baseline / text / tokenswap): same samples, same order; only the user side differs.",
        blocks=[wr.H1(f"Pair {group}"), wr.PanelGrid(runsets=[runset], panels=panels)],
    )


def _distinct_runs(specs: list[str]) -> None:
    """One run given twice would count as two runs of its arm (a pair with itself, a mean over copies)."""
    seen: dict[str, str] = {}
    for spec in specs:
        key = spec if spec.startswith("wandb:") else os.path.realpath(spec)
        if key in seen:
            same = f"{seen[key]!r} and {spec!r} are" if seen[key] != spec else f"{spec!r} is"
            raise InputError(f"--runs: {same} the same run given twice; give each run once")
        seen[key] = spec


def cli_main(argv: list[str]) -> int:
    parser = CommandParser(prog="tokenswap compare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", required=True,
                        help="recipe output folders, W&B offline run folders, or wandb:ENTITY/PROJECT/GROUP")
    parser.add_argument("--out", required=True, help="folder for comparison.md, comparison.json, comparison.png")
    parser.add_argument("--metrics", nargs="+", default=list(DEFAULT_METRICS), metavar="METRIC",
                        help="logged keys to compare, as in log_history.json (default: " + " ".join(DEFAULT_METRICS) + ")")
    parser.add_argument("--wandb-report", action="store_true", help="also create a W&B report (needs --entity/--project/--group)")
    parser.add_argument("--entity", help="W&B entity (user or team) of the report and of wandb: runs")
    parser.add_argument("--project", default="tokenswap", help="W&B project of the report (default: tokenswap)")
    parser.add_argument("--group", help="W&B group of the paired runs, for --wandb-report")
    args = parser.parse_args(argv)
    if args.wandb_report and not (args.entity and args.group):
        raise InputError("--wandb-report needs --entity and --group (the W&B entity and the group of the paired runs)")
    _distinct_runs(args.runs)
    # Every run is read and compared before the output folder is made: a damaged run leaves nothing behind.
    runs = [r for spec in args.runs for r in load_run(spec)]
    table = compare_runs(runs, tuple(args.metrics))
    out = require_output_dir(args.out)
    atomic_write_json(out / "comparison.json", table, allow_nan=False)
    atomic_write_text(out / "comparison.md", to_markdown(table))
    plot_runs(runs, tuple(args.metrics), out / "comparison.png")
    print(to_markdown(table))
    print(f"wrote {out / 'comparison.md'}, {out / 'comparison.png'}, {out / 'comparison.json'}")
    if args.wandb_report:
        report = make_wandb_report(args.entity, args.project, args.group, tuple(args.metrics))
        report.save()
        print(f"W&B report: {report.url}")
    return 0
