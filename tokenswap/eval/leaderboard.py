"""``tokenswap leaderboard``: many evaluated models, one table and figures of their modality gaps and of what
the gaps are made of.

::

    tokenswap leaderboard results/qwen2vl results/qwen25vl GPT-4o=results/gpt4o --out results/board \\
        --group reasoning=Qwen3-VL-8B-Thinking,GPT-5 --group non-reasoning=Qwen2-VL-7B,GPT-4o

Each RESULT is one run's output folder (or a file in it), optionally as ``NAME=PATH`` to name the model; what
is read from ``tokenswap eval``, ``crossmath eval`` and ``rest eval`` folders, and how failed and skipped items
are left out and counted, is in :mod:`tokenswap.eval.leaderboard_runs`. Every run of a leaderboard must be of
one benchmark. A model whose name is a path (a served checkpoint folder) is shown by its last components
(:func:`short_name`); ``--group`` takes either.

Per model: acc_text, acc_interleaved, gap = acc_text - acc_interleaved, relative gap = gap / acc_text and
retention = acc_interleaved / acc_text, each with a 95% interval from a **paired bootstrap over items**:
:data:`DEFAULT_RESAMPLES` resamples of the model's item ids with replacement (both forms of an item move
together, so the gap's interval reflects the per-item pairing), seeded (``--seed``, default 0; the same
seed for every model, so a model's interval does not depend on which other models are on the board), and
the 2.5th/97.5th percentiles. A ratio's interval is left empty when some resample has acc_text = 0. The
resamples are :func:`~tokenswap.eval.stats.bootstrap_indices`' stream, the one ``tokenswap eval`` uses for
gap.json's ``decomposition``: the same seed and resamples give the same intervals in both. ``--resamples`` is
at most :data:`MAX_RESAMPLES`.

**Controls** (runs of ``tokenswap eval --forms ...``): each ``tokenswap eval`` run is decomposed
(:func:`~tokenswap.eval.decompose.decompose` over its scored items), giving per model acc_<form> for every form
run beyond the two ends, the recognition rate (share of distinct pictures identified), the load effect
(text − both), the caption recovery (caption − interleaved), the reading recovery (rendered − interleaved), the
recognised-only gap and the split of the gap into load / recognition / rest, each with its interval, and the
gap by number of images sent. **Across models** (:func:`~tokenswap.eval.stats.pearson`,
:func:`~tokenswap.eval.stats.partial`): Pearson's r of gap with
recognition rate (≥ 3 models with recognition), the partial r controlling for acc_text (≥ 4), and r of gap
with load (≥ 3 models that ran ``both``), each with a bootstrap interval over models and a p-value.

``--group TAG=MODEL,...`` (two or more groups, disjoint): per group the mean gap over its models, the
standard error, and the 95% Student-t interval half-width, which is the paper's "±": its "19.6% ± 3.3%" over
42 models is a stated 95% CI, and its groups' "10.1% ± 2.2% vs 25.5% ± 3.7%, t = -7.48" only fit together
that way (as 95% t half-widths they give t = -7.43 to -7.65 for any split of the 42 models from 8/34 to
26/16; as standard errors, t = -3.58). Then Welch's t-test between every two groups on the per-model gaps
(:func:`~tokenswap.eval.stats.welch_t_test`: ``scipy.stats.ttest_ind(..., equal_var=False)``, t,
Welch-Satterthwaite dof, two-sided p). Every refusal (a bad group, a group too small or without variance for the
test, a run that cannot be decomposed) comes before the first resample is drawn.

Writes ``leaderboard.md``, ``leaderboard.json``, ``leaderboard.csv`` and the figures of
:mod:`tokenswap.eval.leaderboard_figures`: ``leaderboard.png`` (the gap per model, as in the TokenSwap paper's
figure), ``leaderboard_by_images.png`` (gap by images sent, all models) and, when some run has a control,
``leaderboard_components.png`` (each gap split into load / recognition / rest). Model names and group tags are
escaped in markdown (:func:`md_cell`) and kept text in the CSV. An unreadable input (no known result file,
truncated JSON, a folder given twice, two runs with one model name, an unknown model in a group, too many
resamples, an unwritable --out) exits with status 2 naming the file and the fix.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import re
import sys
from itertools import combinations
from pathlib import Path

import numpy as np

from tokenswap.eval import stats
from tokenswap.eval.decompose import check_decomposable, decompose
from tokenswap.eval.forms import ENDS, FORMS, ITEM_FORMS
from tokenswap.eval.leaderboard_figures import plot_by_images, plot_components, plot_gaps
from tokenswap.eval.leaderboard_runs import LeaderboardError, Run, left_out, load_run
from tokenswap.eval.stats import DEFAULT_RESAMPLES, LEVEL, bootstrap_indices, percentile_interval, welch_t_test
from tokenswap.files import atomic_write_text

__all__ = ["DEFAULT_RESAMPLES", "MAX_RESAMPLES", "LeaderboardError", "Run", "build_leaderboard", "cli_main",
           "display_names", "left_out", "load_run", "md_cell", "paired_bootstrap", "plot_by_images",
           "plot_components", "plot_gaps", "short_name", "to_markdown", "welch_t_test"]

# 10x the default: the Monte-Carlo error of a percentile is already ~0.1 point at 10,000. Time grows with it: a
# model of 1,000 items with every form takes ~2.5 s at 10,000 resamples and ~25 s at the cap (index matrices come
# in chunks of 2,000,000 entries, so memory stays near 75 MB); 1,000,000,000 would have asked for 16 GB at once.
MAX_RESAMPLES = 100_000
METRICS = ("acc_text", "acc_interleaved", "gap", "rel_gap", "retention")
TITLES = {"tokenswap": "TokenSwap-Bench", "crossmath": "CrossMath", "rest": "REST"}
# The forms beyond the gap's two ends.
CONTROLS = tuple(f for f in FORMS if f not in ENDS)


# ----------------------------------------------------------------------------- statistics


def _point(text: np.ndarray, inter: np.ndarray) -> dict[str, float | None]:
    acc_t, acc_i = float(text.mean()), float(inter.mean())
    gap = acc_t - acc_i
    rel = gap / acc_t if acc_t > 0 else None
    return {"acc_text": acc_t, "acc_interleaved": acc_i, "gap": gap, "rel_gap": rel,
            "retention": None if rel is None else acc_i / acc_t}


def paired_bootstrap(
    text: np.ndarray, interleaved: np.ndarray, resamples: int = DEFAULT_RESAMPLES, seed: int = 0, level: float = LEVEL
) -> dict[str, tuple[float, float] | None]:
    """Percentile intervals of every metric from resampling items (both forms of an item together).

    Args:
        text: (n,) per-item scores in the text form.
        interleaved: (n,) scores of the same items, same order, in the other form.
        resamples: bootstrap resamples.
        seed: seed of the resampling (numpy ``default_rng``).
        level: interval coverage.

    Returns:
        ``{metric: (low, high)}`` for :data:`METRICS`; a ratio's interval is None when some resample has
        acc_text = 0 (the ratio is undefined there).
    """
    n = len(text)
    if n == 0 or len(interleaved) != n:
        raise ValueError(f"paired bootstrap needs the same n > 0 items in both forms, got {n} and {len(interleaved)}")
    acc_t, acc_i = np.empty(resamples), np.empty(resamples)
    start = 0
    # decompose()'s stream: the same resamples for the same seed, so the board's intervals are gap.json's.
    for idx in bootstrap_indices(n, resamples, seed):
        acc_t[start : start + len(idx)] = text[idx].mean(axis=1)
        acc_i[start : start + len(idx)] = interleaved[idx].mean(axis=1)
        start += len(idx)
    gap = acc_t - acc_i
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = {"acc_text": acc_t, "acc_interleaved": acc_i, "gap": gap, "rel_gap": gap / acc_t,
                 "retention": acc_i / acc_t}
    out = {}
    for key, values in draws.items():
        interval = percentile_interval(values, level)
        out[key] = None if interval is None else tuple(interval)
    return out


# ----------------------------------------------------------------------------- names


def short_name(name: str, parts: int = 2) -> str:
    """The name shown for a model: a path's last ``parts`` components, any other name as it is.

    A name is a path when it starts with ``/``, ``~``, ``.`` or a drive letter (``C:\\``), or has more than two
    ``/``-separated parts (a hub id ``org/name`` has two): a served model named by its checkpoint folder.

    >>> short_name("/srv/models/Qwen2.5-VL-7B-Instruct/checkpoint-500"), short_name("Qwen/Qwen2-VL-7B-Instruct")
    ('Qwen2.5-VL-7B-Instruct/checkpoint-500', 'Qwen/Qwen2-VL-7B-Instruct')
    """
    drive = re.match(r"[A-Za-z]:[\\/]", name) is not None
    pieces = [p for p in re.split(r"[\\/]+" if drive else "/+", name) if p not in ("", ".", "..")]
    if not pieces or not (drive or name[:1] in ("/", "~", ".") or len(pieces) > 2):
        return name
    return "/".join(pieces[-parts:])


def display_names(names: list[str]) -> list[str]:
    """:func:`short_name` of each, with more components where two would read the same (the full name at worst)."""
    parts = dict.fromkeys(names, 2)
    while True:
        labels = {n: short_name(n, parts[n]) for n in names}
        shown = list(labels.values())
        grow = [n for n in names if shown.count(labels[n]) > 1 and short_name(n, parts[n] + 1) != labels[n]]
        if not grow:
            break
        for n in grow:
            parts[n] += 1
    return [labels[n] if shown.count(labels[n]) == 1 else n for n in names]


_MARKUP = re.compile(r"([\\`*_\[\]<>|~&])")


def md_cell(text) -> str:
    r"""Text that stays one markdown table cell: unprintable characters as escapes, markup characters escaped.

    A model name or group tag is the user's (or a served model's) text: a ``|`` or a newline in it would end the
    cell or the row and forge another.

    >>> print(md_cell("m|9 |\n| 1 | `x`"))
    m\|9 \|\\n\| 1 \| \`x\`
    """
    text = str(text).encode("utf-8", "backslashreplace").decode("utf-8")  # lone surrogates from odd bytes
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    return _MARKUP.sub(r"\\\1", text)


def _csv_text(value):
    # A spreadsheet runs a cell that starts with = + - @ as a formula; a quote in front keeps it text.
    if isinstance(value, str) and value[:1] in ("=", "+", "-", "@", "\t", "\r"):
        return "'" + value
    return value


# ----------------------------------------------------------------------------- the board


def _parse_groups(specs: list[str], names: dict[str, str]) -> dict[str, list[str]]:
    """``{tag: [model, ...]}`` from ``TAG=MODEL,...``; a member is a model name or its shown name (``names``)."""
    groups: dict[str, list[str]] = {}
    for spec in specs:
        tag, sep, members = spec.partition("=")
        models = [m.strip() for m in members.split(",") if m.strip()]
        if not sep or not tag or not models:
            raise LeaderboardError(
                f"--group {spec!r}: write TAG=MODEL,MODEL,... (e.g. reasoning=GPT-5,o3)"
            )
        if tag in groups:
            raise LeaderboardError(f"--group {tag!r} is given twice; list all its models in one --group")
        unknown = [m for m in models if m not in names]
        if unknown:
            raise LeaderboardError(
                f"--group {tag}: {unknown} are not models on the board; the models are {list(dict.fromkeys(names.values()))} "
                "(name a run with NAME=PATH)"
            )
        groups[tag] = [names[m] for m in models]
    seen: dict[str, str] = {}
    for tag, models in groups.items():
        for m in models:
            if m in seen:
                raise LeaderboardError(f"model {m!r} is in groups {seen[m]!r} and {tag!r}; groups must be disjoint")
            seen[m] = tag
    if len(groups) == 1:
        raise LeaderboardError("one --group compares with nothing; give two or more (e.g. --group reasoning=... --group other=...)")
    return groups


def check_resamples(resamples: int) -> None:
    """Refuse a resample count outside 1..:data:`MAX_RESAMPLES` (memory and time grow with it)."""
    if not isinstance(resamples, int) or isinstance(resamples, bool) or not 1 <= resamples <= MAX_RESAMPLES:
        raise LeaderboardError(
            f"--resamples {resamples!r} is outside 1 to {MAX_RESAMPLES:,}: memory and time grow with it, and "
            f"{DEFAULT_RESAMPLES:,} (the default) already puts a 95% bound within about 0.1 point; give at most "
            f"{MAX_RESAMPLES}"
        )


def _columns(controls: list[str]) -> list[str]:
    """The per-model control columns of a board whose runs ran ``controls``, in the order tables show them."""
    cols = [f"acc_{f}" for f in ITEM_FORMS if f in controls]
    if "recognition" in controls:
        cols.append("recognition_rate")
    needs = {"load": ("both",), "caption_recovery": ("caption",), "reading_recovery": ("rendered",),
             "recognised_only_gap": ("recognition",), "split_load": ("both",), "split_recognition": ("recognition",),
             "split_rest": ("both", "recognition")}
    return cols + [c for c, forms in needs.items() if any(f in controls for f in forms)]


_WHERE = {"load": ("load",), "caption_recovery": ("caption_recovery",), "reading_recovery": ("reading_recovery",),
          "recognition_rate": ("recognition_rate",), "recognised_only_gap": ("recognised_only", "gap"),
          "split_load": ("components", "load"), "split_recognition": ("components", "recognition"),
          "split_rest": ("components", "rest")}


def _check_decomposable(run: Run) -> None:
    try:
        check_decomposable(run.records, run.pictures)
    except ValueError as err:
        raise LeaderboardError(f"{run.path / 'gap.json'}: {err}; rerun `tokenswap eval`, which writes it") from None


def _decomposed(run: Run, columns: list[str], resamples: int, seed: int) -> dict:
    """The row fields decompose() gives a ``tokenswap eval`` run (checked by :func:`_check_decomposable` first):
    each control column with its interval."""
    d = decompose(run.records, run.pictures, resamples=resamples, seed=seed, level=LEVEL)
    out: dict = {"controls": list(run.controls), "by_images_sent": d["by_images_sent"], "decomposition": d}
    for col in columns:
        e = d["acc"].get(col[4:]) if col.startswith("acc_") else d
        for key in () if col.startswith("acc_") else _WHERE[col]:
            e = None if e is None else e.get(key)
        out[col], out[f"{col}_ci"] = (None, None) if e is None else (e["value"], e["ci"])
    if "recognition_rate" in columns:
        rate, only = d["recognition_rate"], d["recognised_only"]
        out["n_pictures"] = None if rate is None else rate["n_pictures"]
        out["pictures_failed"] = run.pictures_failed
        out["n_recognised"] = None if only is None else only["n"]
    return out


def _across(rows: list[dict], resamples: int, seed: int) -> dict:
    """Correlations over models: gap with recognition rate (and controlling for acc_text), gap with load."""
    rec = [r for r in rows if r.get("recognition_rate") is not None]
    gap, rate, text = ([r[k] for r in rec] for k in ("gap", "recognition_rate", "acc_text"))
    load = [r for r in rows if r.get("load") is not None]
    out = {
        "gap_vs_recognition": stats.pearson(gap, rate, resamples, seed, LEVEL, what="recognition"),
        "gap_vs_recognition_given_text": stats.partial(gap, rate, text, resamples, seed, LEVEL,
                                                             what="recognition"),
        "gap_vs_load": stats.pearson([r["gap"] for r in load], [r["load"] for r in load], resamples, seed,
                                           LEVEL, what="the both form"),
    }
    for key, models in (("gap_vs_recognition", rec), ("gap_vs_recognition_given_text", rec), ("gap_vs_load", load)):
        out[key]["models"] = [r["model"] for r in models]
    out["gap_vs_recognition_given_text"]["control"] = "acc_text"
    return out


def _results_key(run: Run) -> tuple:
    """What a run answered: its items and every form's per-item scores (and the controls' records)."""
    return (tuple(run.item_ids), run.text.tobytes(), run.interleaved.tobytes(),
            json.dumps(run.records, sort_keys=True, default=str), json.dumps(run.pictures, sort_keys=True, default=str))


def build_leaderboard(
    runs: list[Run], groups: list[str] | None = None, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> dict:
    """Rows sorted by gap (largest first) with bootstrap intervals, group summaries and Welch tests.

    ``tokenswap eval`` runs are decomposed (:func:`~tokenswap.eval.decompose.decompose`, the same seeded stream):
    every row has ``by_images_sent``; when some run has controls, each row has the control columns
    (:func:`_columns`) and the board the correlations across models (``across_models``).

    Raises:
        LeaderboardError: runs of different benchmarks, one folder twice, one model name twice, a bad group, or
            ``resamples`` over :data:`MAX_RESAMPLES`.
    """
    check_resamples(resamples)
    folders: dict[Path, Run] = {}
    for run in runs:
        key = run.path.resolve()
        if key in folders:
            also = "" if folders[key].path == run.path else f" (also as {folders[key].path})"
            raise LeaderboardError(f"{run.path} is given twice{also}; list each run once")
        folders[key] = run
    names: dict[str, Run] = {}
    for run in runs:
        if run.name in names:
            raise LeaderboardError(
                f"{names[run.name].path} and {run.path} are both of model {run.name!r}; name them apart with "
                f"NAME=PATH (e.g. {run.name}-a={names[run.name].path})"
            )
        names[run.name] = run
    benchmarks = sorted({r.benchmark for r in runs})
    if len(benchmarks) > 1:
        by = {b: [str(r.path) for r in runs if r.benchmark == b] for b in benchmarks}
        raise LeaderboardError(f"runs of different benchmarks cannot share one board: {by}; make one per benchmark")
    labels = dict(zip(names, display_names(list(names))))
    aliases = {label: name for name, label in labels.items()} | {name: name for name in names}
    tag_of = {m: tag for tag, models in _parse_groups(groups or [], aliases).items() for m in models}
    controls = [f for f in CONTROLS if any(f in r.controls for r in runs)]
    columns = _columns(controls)
    # Everything that can refuse the board is checked on the points, before the first resample.
    points = {run.name: _point(run.text, run.interleaved) for run in runs}
    for run in runs:
        if run.records is not None:
            _check_decomposable(run)
    ranked = sorted(runs, key=lambda r: (-points[r.name]["gap"], r.name))
    # Two runs with the same answer on every item of every form are one replicate written twice (a second seed
    # that reached nothing random): the means over models and the groups' tests count it once.
    copies: dict[tuple, list[Run]] = {}
    for run in ranked:
        copies.setdefault(_results_key(run), []).append(run)
    counted = {id(same[0]) for same in copies.values()}
    same_replicate = [[r.name for r in same] for same in copies.values() if len(same) > 1]
    by_tag: dict[str, list[float]] = {}
    for run in ranked:
        if run.name in tag_of and id(run) in counted:
            by_tag.setdefault(tag_of[run.name], []).append(points[run.name]["gap"])
    tags = [t for t in dict.fromkeys(tag_of.values())]
    tests = []
    for a, b in combinations(tags, 2):
        try:
            tests.append({"a": a, "b": b, **welch_t_test(by_tag[a], by_tag[b])})
        except ValueError as err:
            raise LeaderboardError(f"--group {a} vs {b}: {err}") from None
    rows = []
    for run in ranked:
        ci = paired_bootstrap(run.text, run.interleaved, resamples=resamples, seed=seed)
        row = {"model": run.name, "label": labels[run.name], "group": tag_of.get(run.name), "path": str(run.path),
               "n": len(run.item_ids), "failed": run.failed, "skipped": run.skipped, "unpaired": run.unpaired,
               **points[run.name], **{f"{k}_ci": None if ci[k] is None else list(ci[k]) for k in METRICS}}
        if run.records is not None:
            row |= _decomposed(run, columns, resamples, seed)
        rows.append(row)
    item_sets = {tuple(r.item_ids) for r in runs}
    return {
        "benchmark": benchmarks[0],
        "title": TITLES[benchmarks[0]],
        "forms": list(runs[0].forms),
        "controls": controls,
        "columns": columns,
        "bootstrap": {"resamples": resamples, "seed": seed, "level": LEVEL, "unit": "item (both forms together)",
                      "interval": "percentile"},
        "same_items": len(item_sets) == 1,
        "rows": rows,
        "all_models": stats.summary([points[r.name]["gap"] for r in ranked if id(r) in counted], LEVEL),
        "same_replicate": same_replicate,
        "groups": {t: stats.summary(by_tag[t], LEVEL) for t in tags},
        "tests": tests,
        "across_models": _across(rows, resamples, seed) if controls else None,
    }


# ----------------------------------------------------------------------------- tables


def _f(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "–"
    return f"{100 * v:.1f}" if pct else f"{v:.3f}"


def _ci(v: list[float] | None) -> str:
    return "–" if v is None else f"[{v[0]:.3f}, {v[1]:.3f}]"


def _fci(r: dict, key: str) -> str:
    v, ci = r.get(key), r.get(f"{key}_ci")
    if v is None:
        return "–"
    return f"{v:.3f}" if ci is None else f"{v:.3f} {_ci(ci)}"


_HEADS = {"recognition_rate": "recognition rate (pictures)", "load": "load = text − both",
          "caption_recovery": "caption recovery = caption − interleaved",
          "reading_recovery": "reading recovery = rendered − interleaved",
          "recognised_only_gap": "recognised-only gap (items)", "split_recognition": "split: recognition",
          "split_rest": "split: rest"}


def _correlation_line(name: str, c: dict) -> str:
    if c["r"] is None:
        return f"- {name}: n/a ({c['reason']})"
    if c["ci"] is None:
        interval = f"95% CI n/a ({c['reason']})"
    else:
        dropped = f", {c['undefined_resamples']:,} of them dropped as fixed by arithmetic" \
            if c["undefined_resamples"] else ""
        interval = (f"95% CI [{c['ci'][0]:+.3f}, {c['ci'][1]:+.3f}] (bootstrap over models, {c['resamples']:,} "
                    f"resamples{dropped})")
    return f"- {name}: r = {c['r']:+.3f} over {c['n_models']} models, {interval}; p = {c['p']:.3g} (t, {c['dof']} dof)"


def _controls_markdown(board: dict) -> list[str]:
    cols = [c for c in board["columns"] if c != "split_load"]  # split_load is the load column
    rows = board["rows"]
    lines = [
        "",
        f"## What the gaps are made of (controls run: {', '.join(board['controls'])})",
        "",
        "Fractions with 95% paired-bootstrap intervals over items (the resamples above); each model over its own "
        "items answered in every form it ran. The split adds up to the gap: load + recognition + rest "
        "(load = text − both; recognition: what the items with an unidentified picture add; rest: the part left "
        "on items whose every picture was identified). Associations on one item set, not causes.",
        "",
        "| # | model | " + " | ".join(_HEADS.get(c, c) for c in cols) + " |",
        "|---:|---|" + "---|" * len(cols),
    ]
    for rank, r in enumerate(rows, start=1):
        cells = []
        for c in cols:
            cell = _fci(r, c)
            if c == "recognition_rate" and r.get("n_pictures") is not None:
                cell += f" ({r['n_pictures']})"
            if c == "recognised_only_gap" and r.get("n_recognised") is not None:
                cell += f" ({r['n_recognised']})"
            cells.append(cell)
        lines.append(f"| {rank} | {md_cell(r['label'])} | " + " | ".join(cells) + " |")
    a = board["across_models"]
    lines += [
        "",
        "## Across models",
        "",
        "Each model is one point; a model without the control is left out of that line.",
        "",
        _correlation_line("gap vs recognition rate (Pearson)", a["gap_vs_recognition"]),
        _correlation_line("gap vs recognition rate controlling for acc_text (partial)",
                          a["gap_vs_recognition_given_text"]),
        _correlation_line("gap vs load (Pearson; load is a part of the gap, so some positive r is built in)",
                          a["gap_vs_load"]),
    ]
    return lines


def _by_images_markdown(rows: list[dict]) -> list[str]:
    ks = sorted({int(k) for r in rows for k in r.get("by_images_sent") or {}})
    lines = ["", "## Gap by images sent", "",
             "Per model and number of image parts sent, the gap with its 95% interval (each group resampled on its "
             "own) and the items in the group.", "",
             "| # | model | " + " | ".join(f"{k} image{'s' * (k != 1)}" for k in ks) + " |",
             "|---:|---|" + "---|" * len(ks)]
    for rank, r in enumerate(rows, start=1):
        groups = r.get("by_images_sent") or {}
        cells = []
        for k in ks:
            g = groups.get(str(k))
            cells.append("–" if g is None else f"{g['gap']['value']:.3f} {_ci(g['gap']['ci'])} (n {g['n']})")
        lines.append(f"| {rank} | {md_cell(r['label'])} | " + " | ".join(cells) + " |")
    return lines


def to_markdown(board: dict) -> str:
    """The board as markdown: the gap table (fractions), controls, the gap by images sent, groups and tests.

    Model names and group tags pass through :func:`md_cell`, so no name can end a cell or forge a row.
    """
    b = board["bootstrap"]
    text_form, other = board["forms"]
    lines = [
        f"# Modality gap leaderboard ({TITLES[board['benchmark']]}, {len(board['rows'])} models, {text_form} vs {other})",
        "",
        f"95% intervals: paired bootstrap over items ({b['resamples']:,} resamples, seed {b['seed']}, percentile). "
        "Failed requests and skipped items are left out of both forms and counted, never scored as wrong; n is "
        "the items scored.",
    ]
    if not board["same_items"]:
        lines.append("Note: the runs cover different item sets (see n); each gap is over its own run's items.")
    lines += [
        "",
        "| # | model | group | n | failed | skipped | unpaired | acc_text | acc_interleaved | gap | gap 95% CI | rel_gap "
        "| rel_gap 95% CI | retention | retention 95% CI |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---|---:|---|---:|---|",
    ]
    for rank, r in enumerate(board["rows"], start=1):
        lines.append(
            f"| {rank} | {md_cell(r['label'])} | {md_cell(r['group'] or '')} | {r['n']} | {r['failed']} "
            f"| {r['skipped']} | {r['unpaired']} "
            f"| {_f(r['acc_text'])} | {_f(r['acc_interleaved'])} | {_f(r['gap'])} | {_ci(r['gap_ci'])} "
            f"| {_f(r['rel_gap'])} | {_ci(r['rel_gap_ci'])} | {_f(r['retention'])} | {_ci(r['retention_ci'])} |"
        )
    s = board["all_models"]
    lines += ["", f"Mean gap over {s['n']} models: {_f(s['mean'], True)}% ± {_f(s['ci_half'], True)}% "
              "(95% t interval over models)."]
    for names in board.get("same_replicate", []):
        lines.append(f"Counted once in the means and tests: {', '.join(md_cell(n) for n in names)} answered every "
                     "item alike (one replicate: same order, swaps and settings).")
    if board["controls"]:
        lines += _controls_markdown(board)
    if any(len(r.get("by_images_sent") or {}) > 1 for r in board["rows"]):
        lines += _by_images_markdown(board["rows"])
    if board["groups"]:
        lines += ["", "| group | models | mean gap | ± (95% CI) | standard error |", "|---|---:|---:|---:|---:|"]
        for tag, g in board["groups"].items():
            lines.append(f"| {md_cell(tag)} | {g['n']} | {_f(g['mean'], True)}% | {_f(g['ci_half'], True)}% "
                         f"| {_f(g['se'], True)}% |")
        lines.append("")
        for t in board["tests"]:
            lines.append(f"Welch's t-test, {md_cell(t['a'])} vs {md_cell(t['b'])} (per-model gaps): "
                         f"t = {t['t']:.2f}, dof = {t['dof']:.1f}, p = {t['p']:.3g}")
    return "\n".join(lines) + "\n"


def _write_csv(board: dict, path: Path) -> None:
    extra = list(board["columns"])
    fields = ["rank", "model", "label", "group", "n", "failed", "skipped", "unpaired"]
    for k in (*METRICS, *extra):
        fields += [k, f"{k}_lo", f"{k}_hi"]
    if "recognition_rate" in extra:
        fields += ["n_pictures", "pictures_failed", "n_recognised"]
    fields.append("path")
    buf = io.StringIO(newline="")
    writer = csv.DictWriter(buf, fieldnames=fields)
    writer.writeheader()
    for rank, r in enumerate(board["rows"], start=1):
        row = {k: r.get(k) for k in fields if k in r} | {"rank": rank}
        for k in (*METRICS, *extra):
            lo, hi = r.get(f"{k}_ci") or (None, None)
            row |= {k: r.get(k), f"{k}_lo": lo, f"{k}_hi": hi}
        writer.writerow({k: _csv_text(v) for k, v in row.items()})
    atomic_write_text(path, buf.getvalue(), errors="backslashreplace")


# ----------------------------------------------------------------------------- command


def _parser() -> argparse.ArgumentParser:
    from tokenswap.inputs import non_negative_int, positive_int
    from tokenswap.script import CommandParser

    p = CommandParser(
        prog="tokenswap leaderboard", description="many evaluated models: one gap table and figures"
    )
    p.add_argument("results", nargs="+", metavar="RESULT",
                   help="a tokenswap/crossmath/rest eval --out folder, or NAME=FOLDER to name the model")
    p.add_argument("--out", default="leaderboard",
                   help="folder for leaderboard.{md,json,csv,png} and the other figures (default: leaderboard)")
    # One group per flag: RESULT folders may then follow a --group without being read as groups.
    p.add_argument("--group", action="append", default=[], metavar="TAG=MODEL,MODEL",
                   help="a group of models; repeat the flag for each group (two or more: Welch's t-test of their gaps)")
    p.add_argument("--resamples", type=positive_int, default=DEFAULT_RESAMPLES,
                   help=f"bootstrap resamples (default: {DEFAULT_RESAMPLES}, at most {MAX_RESAMPLES})")
    p.add_argument("--seed", type=non_negative_int, default=0, help="bootstrap seed (default: 0)")
    return p


def _printable(text: str) -> str:
    return text.encode(sys.stdout.encoding or "utf-8", "backslashreplace").decode(sys.stdout.encoding or "utf-8")


def cli_main(argv: list[str]) -> int:
    """Entry point of ``tokenswap leaderboard``; returns the exit status (2 for unreadable input)."""
    args = _parser().parse_args(argv)
    out = Path(args.out)
    check_resamples(args.resamples)
    runs = [load_run(spec) for spec in args.results]
    board = build_leaderboard(runs, args.group, args.resamples, args.seed)
    markdown = to_markdown(board)
    try:
        out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out / "leaderboard.md", markdown, errors="backslashreplace")
        atomic_write_text(out / "leaderboard.json", json.dumps(board, indent=2, ensure_ascii=False) + "\n",
                          errors="backslashreplace")
        _write_csv(board, out / "leaderboard.csv")
        written = ["leaderboard.md", "leaderboard.json", "leaderboard.csv", "leaderboard.png"]
        plot_gaps(board, out / "leaderboard.png")
        if plot_by_images(board, out / "leaderboard_by_images.png") is not None:
            written.append("leaderboard_by_images.png")
        if plot_components(board, out / "leaderboard_components.png") is not None:
            written.append("leaderboard_components.png")
    except OSError as err:
        raise LeaderboardError(f"--out {out}: cannot write there ({err.strerror or err}); pass a writable "
                               "folder") from None
    print(_printable(markdown))
    print(_printable(f"wrote {', '.join(str(out / w) for w in written)}"))
    return 0

