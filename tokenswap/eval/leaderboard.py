"""``tokenswap leaderboard``: many evaluated models, one table and one figure of their modality gaps.

::

    tokenswap leaderboard results/qwen2vl results/qwen25vl GPT-4o=results/gpt4o --out results/board \\
        --group reasoning=Qwen3-VL-8B-Thinking,GPT-5 --group non-reasoning=Qwen2-VL-7B,GPT-4o

Each RESULT is one run's output folder (or a file in it), optionally as ``NAME=PATH`` to name the model
(the default name is the run's ``model`` field):

* ``tokenswap eval``: ``gap.json``; text vs interleaved form, ``correct_text`` / ``correct_interleaved`` per item;
* ``tokenswap crossmath eval``: ``predictions_text.jsonl`` and ``predictions_image.jsonl`` (+ their
  ``metrics_*.json``); text vs image, a puzzle is correct when every blank is (the paper's macro accuracy);
* ``tokenswap rest eval``: ``metrics.json`` + ``predictions.jsonl``; text vs image (the whole question
  rendered) on the plain-REST rendering, re-scored with the REST extractor against the gold answers of the
  dataset folder that ``metrics.json`` names.

Every run of a leaderboard must be of one benchmark. Items are paired by id; an item without a record of
both forms is left out and counted (``unpaired``). **Failed requests**: a record with a non-null ``error``
(or ``error_<form>`` / ``<form>_error``) field, or ``failed: true``, or a null correctness, is a request
that got no answer; the item is left out of *both* forms and counted (``failed``), never scored as a wrong
answer. A record with a non-null ``skipped`` (``skipped_<form>``, ``<form>_skipped``; an item never sent,
e.g. over ``--max-images``) is left out of both forms the same way and counted apart (``skipped``).

Per model: acc_text, acc_interleaved, gap = acc_text - acc_interleaved, relative gap = gap / acc_text and
retention = acc_interleaved / acc_text, each with a 95% interval from a **paired bootstrap over items**:
:data:`DEFAULT_RESAMPLES` resamples of the model's item ids with replacement (both forms of an item move
together, so the gap's interval reflects the per-item pairing), seeded (``--seed``, default 0; the same
seed for every model, so a model's interval does not depend on which other models are on the board), and
the 2.5th/97.5th percentiles. A ratio's interval is left empty when some resample has acc_text = 0.

``--group TAG=MODEL,...`` (two or more groups, disjoint): per group the mean gap over its models, the
standard error, and the 95% Student-t interval half-width, which is the paper's "±": its "19.6% ± 3.3%" over
42 models is a stated 95% CI, and its groups' "10.1% ± 2.2% vs 25.5% ± 3.7%, t = -7.48" only fit together
that way (as 95% t half-widths they give t = -7.43 to -7.65 for any split of the 42 models from 8/34 to
26/16; as standard errors, t = -3.58). Then Welch's t-test between every two groups on the per-model gaps
(t, Welch-Satterthwaite dof, two-sided p from the exact t CDF of :mod:`tokenswap.eval.stats`; no scipy).

Writes ``leaderboard.md``, ``leaderboard.json``, ``leaderboard.csv`` and ``leaderboard.png`` (the gap per
model as horizontal bars with interval whiskers, largest gap on top, as in the TokenSwap paper's figure).
An unreadable input (no known result file, truncated JSON, a folder given twice, two runs with one model
name, an unknown model in a group) exits with status 2 naming the file and the fix.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path

import numpy as np

from tokenswap.errors import InputError
from tokenswap.eval.stats import t_cdf, t_quantile

__all__ = ["DEFAULT_RESAMPLES", "LeaderboardError", "Run", "build_leaderboard", "cli_main", "left_out", "load_run",
           "paired_bootstrap", "plot_gaps", "to_markdown", "welch_t_test"]

DEFAULT_RESAMPLES = 10_000
LEVEL = 0.95
METRICS = ("acc_text", "acc_interleaved", "gap", "rel_gap", "retention")
CROSSMATH_FORMS = ("text", "image")
REST_FORMS = ("text", "image")
TITLES = {"tokenswap": "TokenSwap-Bench", "crossmath": "CrossMath", "rest": "REST"}


class LeaderboardError(InputError):
    """An input the leaderboard cannot read; one line naming the file and the fix, exit status 2."""


@dataclass
class Run:
    """One model's paired per-item scores (1.0 correct, 0.0 wrong), item ids sorted.

    Args:
        name: the model name shown.
        benchmark: ``tokenswap``, ``crossmath`` or ``rest``.
        path: the result folder.
        forms: the two forms compared (``text`` first).
        item_ids: scored items (failed, skipped and unpaired ones left out).
        text: (n,) scores in the text form.
        interleaved: (n,) scores in the other form.
        failed: items left out because a request of either form failed.
        skipped: items left out because either form was never sent (e.g. over the image cap).
        unpaired: items left out because they lack a record of one form or both.
    """

    name: str
    benchmark: str
    path: Path
    forms: tuple[str, str]
    item_ids: list[str]
    text: np.ndarray
    interleaved: np.ndarray
    failed: int = 0
    skipped: int = 0
    unpaired: int = 0


# ----------------------------------------------------------------------------- reading runs


def left_out(*records: dict) -> str | None:
    """``failed`` when a record of the item is a failed request, ``skipped`` when one was never sent, else None.

    >>> left_out({"id": "q1", "correct_text": True}, {"id": "q1", "error": "HTTP 500 after 5 tries"})
    'failed'
    >>> left_out({"id": "q1", "skipped": "7 images > --max-images 6"}), left_out({"id": "q1", "error": None})
    ('skipped', None)
    """
    for kind, word in (("failed", "error"), ("skipped", "skipped")):
        for record in records:
            if kind == "failed" and record.get("failed") is True:
                return kind
            # Evaluators write the bare field only when it applies, so its presence counts; a per-form
            # variant counts when it says something, so a count such as 0 does not.
            if record.get(word) is not None or any(
                value and (key.startswith(f"{word}_") or key.endswith(f"_{word}")) for key, value in record.items()
            ):
                return kind
    return None


def _read_json(path: Path) -> dict:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise LeaderboardError(f"{path} is not UTF-8 text; is it a result file?") from None
    except json.JSONDecodeError as err:
        raise LeaderboardError(
            f"{path} is not valid JSON ({err.msg} at line {err.lineno}, column {err.colno}; truncated?); "
            "rerun the evaluation that wrote it, or restore the file"
        ) from None
    if not isinstance(data, dict):
        raise LeaderboardError(f"{path} holds a JSON {type(data).__name__}, not a result object; is it a result file?")
    return data


def _read_jsonl(path: Path) -> list[dict]:
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise LeaderboardError(f"{path} is not UTF-8 text; is it a result file?") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as err:
            raise LeaderboardError(
                f"{path}:{number} is not valid JSON ({err.msg}; a run killed mid-write?); rerun the same eval "
                "command, which resumes, or delete that line"
            ) from None
    return rows


def _model_name(name: str | None, found, source: Path) -> str:
    if name:
        return name
    if not found or not isinstance(found, str):
        raise LeaderboardError(f"{source} names no model (field 'model'); pass the run as NAME={source.parent}")
    return found


def _as_score(value, key: str, source: Path, item_id: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or value in (0, 1):
        return float(value)
    raise LeaderboardError(f"{source}: item {item_id!r} has {key}={value!r}, expected true/false")


def _pair(scored: dict[str, tuple[float, float]]) -> tuple[list[str], np.ndarray, np.ndarray]:
    ids = sorted(scored)
    return ids, np.array([scored[i][0] for i in ids]), np.array([scored[i][1] for i in ids])


def _load_tokenswap(folder: Path, name: str | None) -> Run:
    source = folder / "gap.json"
    data = _read_json(source)
    items = data.get("items")
    if not isinstance(items, list):
        raise LeaderboardError(f"{source} has no per-item 'items' list; write it with `tokenswap eval` (gap.json)")
    scored, left = {}, {"failed": 0, "skipped": 0}
    seen = set()
    for record in items:
        if not isinstance(record, dict) or "id" not in record:
            raise LeaderboardError(f"{source}: an item record is not an object with an 'id' field: {str(record)[:80]}")
        item_id = str(record["id"])
        if item_id in seen:
            raise LeaderboardError(f"{source}: item id {item_id!r} appears twice; items are paired by id")
        seen.add(item_id)
        kind = left_out(record)
        if kind is not None:  # a failed or skipped record need not carry correctness at all
            left[kind] += 1
            continue
        for key in ("correct_text", "correct_interleaved"):
            if key not in record:
                raise LeaderboardError(f"{source}: item {item_id!r} has no {key!r} field (keys {sorted(record)})")
        text = _as_score(record["correct_text"], "correct_text", source, item_id)
        inter = _as_score(record["correct_interleaved"], "correct_interleaved", source, item_id)
        if text is None or inter is None:
            left["failed"] += 1
            continue
        scored[item_id] = (text, inter)
    ids, text, inter = _pair(scored)
    model = _model_name(name, data.get("model"), source)
    return Run(model, "tokenswap", folder, ("text", "interleaved"), ids, text, inter, **left)


def _by_id(rows: list[dict], source: Path) -> dict[str, dict]:
    out = {}
    for row in rows:
        if "id" not in row:
            raise LeaderboardError(f"{source}: a record has no 'id' field (keys {sorted(row)})")
        out[str(row["id"])] = row  # a resumed run may repeat an id; the last record is the one scored
    return out


def _load_crossmath(folder: Path, name: str | None) -> Run:
    from tokenswap.crossmath.metrics import gold_answer

    forms, models = {}, {}
    for modality in CROSSMATH_FORMS:
        source = folder / f"predictions_{modality}.jsonl"
        if not source.exists():
            raise LeaderboardError(
                f"{folder} has no {source.name}; the gap needs both forms: run `tokenswap crossmath eval "
                f"--modality {modality} --out {folder}` with the same model and data"
            )
        forms[modality] = _by_id(_read_jsonl(source), source)
        metrics = folder / f"metrics_{modality}.json"
        found = _read_json(metrics).get("model") if metrics.exists() else None
        models[modality] = found or next((r.get("model") for r in forms[modality].values() if r.get("model")), None)
    if models["text"] != models["image"]:
        raise LeaderboardError(
            f"{folder}: predictions_text.jsonl is of model {models['text']!r} but predictions_image.jsonl of "
            f"{models['image']!r}; a gap compares one model's two forms, put each model in its own folder"
        )
    text, image = forms["text"], forms["image"]
    scored, left = {}, {"failed": 0, "skipped": 0}
    for item_id in sorted(set(text) & set(image)):
        rows = (text[item_id], image[item_id])
        kind = left_out(*rows)
        if kind is not None:
            left[kind] += 1
            continue
        scores = []
        for row in rows:
            if "answer" not in row or "prediction" not in row:
                raise LeaderboardError(f"{folder}: puzzle {item_id!r} has no 'answer'/'prediction' field")
            scores.append(float(list(row["prediction"] or []) == gold_answer({"markdown_answer": row["answer"]})))
        scored[item_id] = tuple(scores)
    ids, t, i = _pair(scored)
    model = _model_name(name, models["text"], folder / "metrics_text.json")
    unpaired = len(set(text) ^ set(image))
    return Run(model, "crossmath", folder, CROSSMATH_FORMS, ids, t, i, unpaired=unpaired, **left)


def _load_rest(folder: Path, name: str | None) -> Run:
    from tokenswap.rest.evaluate import TEXT_VARIANT
    from tokenswap.rest.extract import extract_answer
    from tokenswap.rest.items import read_items

    source = folder / "metrics.json"
    metrics = _read_json(source)
    for key in ("data", "n_items", "base_variant"):
        if key not in metrics:
            raise LeaderboardError(f"{source} has no {key!r} field; is it written by `tokenswap rest eval`?")
    data = Path(metrics["data"])
    if not (data / "items.jsonl").exists():
        raise LeaderboardError(
            f"{source}: the REST dataset it was scored on, {str(data)!r} (field 'data'), has no items.jsonl here; "
            "the gold answers are read from it: run from the folder the eval ran in, or set 'data' to its path"
        )
    predictions = {}
    for row in _read_jsonl(folder / "predictions.jsonl"):
        if "key" not in row:
            raise LeaderboardError(f"{folder / 'predictions.jsonl'}: a record has no 'key' field (keys {sorted(row)})")
        predictions[row["key"]] = row
    variants = {"text": TEXT_VARIANT, "image": metrics["base_variant"]}
    scored, left, unpaired = {}, {"failed": 0, "skipped": 0}, 0
    for item in read_items(data / "items.jsonl")[: metrics["n_items"]]:
        rows = [predictions.get(f"{item.id}|{form}|{variants[form]}") for form in REST_FORMS]
        if any(r is None for r in rows):
            unpaired += 1
            continue
        kind = left_out(*rows) or ("failed" if any(r.get("response") is None for r in rows) else None)
        if kind is not None:
            left[kind] += 1
            continue
        scored[item.id] = tuple(
            float(extract_answer(r["response"], item.answer_type, item.options) == item.gold) for r in rows
        )
    ids, t, i = _pair(scored)
    model = _model_name(name, metrics.get("model"), source)
    return Run(model, "rest", folder, REST_FORMS, ids, t, i, unpaired=unpaired, **left)


def _kinds(folder: Path) -> list[str]:
    kinds = []
    if (folder / "gap.json").exists():
        kinds.append("tokenswap")
    if any((folder / f"predictions_{m}.jsonl").exists() for m in CROSSMATH_FORMS):
        kinds.append("crossmath")
    if (folder / "metrics.json").exists() and (folder / "predictions.jsonl").exists():
        kinds.append("rest")
    return kinds


def load_run(spec: str) -> Run:
    """One run from ``PATH`` or ``NAME=PATH`` (a result folder, or a result file inside it).

    Raises:
        LeaderboardError: nothing readable there; the message names the file and the fix.
    """
    name, path = None, spec
    if not os.path.exists(spec) and "=" in spec:
        name, path = spec.split("=", 1)
        if not name:
            raise LeaderboardError(f"{spec!r}: the name before '=' is empty; write NAME=PATH")
    folder = Path(path)
    if folder.is_file():
        folder = folder.parent
    if not folder.is_dir():
        raise LeaderboardError(f"result {path!r} does not exist; pass a `tokenswap eval`, crossmath or rest eval --out folder")
    kinds = _kinds(folder)
    if not kinds:
        raise LeaderboardError(
            f"{folder} holds no known result file (gap.json from `tokenswap eval`, predictions_text.jsonl + "
            "predictions_image.jsonl from `tokenswap crossmath eval`, metrics.json + predictions.jsonl from "
            "`tokenswap rest eval`); pass the --out folder of one of those"
        )
    if len(kinds) > 1:
        raise LeaderboardError(f"{folder} holds results of {' and '.join(kinds)}; give each run its own folder")
    run = {"tokenswap": _load_tokenswap, "crossmath": _load_crossmath, "rest": _load_rest}[kinds[0]](folder, name)
    if not run.item_ids:
        raise LeaderboardError(
            f"{folder}: no item to score ({run.failed} failed, {run.skipped} skipped, {run.unpaired} without both "
            "forms); rerun the evaluation"
        )
    return run


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
    rng = np.random.default_rng(seed)
    acc_t, acc_i = np.empty(resamples), np.empty(resamples)
    chunk = max(1, 2_000_000 // n)  # bounds the (chunk, n) index matrix at ~16 MB
    for start in range(0, resamples, chunk):
        idx = rng.integers(0, n, size=(min(chunk, resamples - start), n))
        acc_t[start : start + len(idx)] = text[idx].mean(axis=1)
        acc_i[start : start + len(idx)] = interleaved[idx].mean(axis=1)
    gap = acc_t - acc_i
    with np.errstate(divide="ignore", invalid="ignore"):
        draws = {"acc_text": acc_t, "acc_interleaved": acc_i, "gap": gap, "rel_gap": gap / acc_t,
                 "retention": acc_i / acc_t}
    q = [100 * (1 - level) / 2, 100 * (1 + level) / 2]
    out = {}
    for key, values in draws.items():
        if not np.isfinite(values).all():
            out[key] = None
            continue
        lo, hi = np.percentile(values, q)
        out[key] = (float(lo), float(hi))
    return out


def _summary(values: list[float], level: float = LEVEL) -> dict[str, float | None]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return {"n": n, "mean": mean, "sd": None, "se": None, "ci_half": None}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    se = sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "se": se, "ci_half": t_quantile(0.5 + level / 2, n - 1) * se}


def welch_t_test(a: list[float], b: list[float]) -> dict[str, float]:
    """Welch's unequal-variance t-test of mean(a) vs mean(b).

    t = (mean_a - mean_b) / sqrt(s_a²/n_a + s_b²/n_b), with Welch-Satterthwaite degrees of freedom and a
    two-sided p from the exact Student-t CDF.

    >>> r = welch_t_test([0.1, 0.3], [0.5, 0.7])  # equal n and variance: dof = 2(n - 1), p = 1 - 2/sqrt(5)
    >>> round(r["t"], 6), round(r["dof"], 6), round(r["p"], 6)
    (-2.828427, 2.0, 0.105573)

    Raises:
        ValueError: a group has fewer than 2 values, or both have zero variance (t is undefined).
    """
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's t-test needs at least 2 values per group, got {len(a)} and {len(b)}")
    sa, sb = _summary(a), _summary(b)
    va, vb = sa["se"] ** 2, sb["se"] ** 2
    if va + vb == 0:
        raise ValueError("both groups have zero variance; Welch's t is undefined")
    t = (sa["mean"] - sb["mean"]) / math.sqrt(va + vb)
    dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
    return {"t": t, "dof": dof, "p": 2 * t_cdf(-abs(t), dof)}


# ----------------------------------------------------------------------------- the board


def _parse_groups(specs: list[str], names: list[str]) -> dict[str, list[str]]:
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
                f"--group {tag}: {unknown} are not models on the board; the models are {names} "
                "(name a run with NAME=PATH)"
            )
        groups[tag] = models
    seen: dict[str, str] = {}
    for tag, models in groups.items():
        for m in models:
            if m in seen:
                raise LeaderboardError(f"model {m!r} is in groups {seen[m]!r} and {tag!r}; groups must be disjoint")
            seen[m] = tag
    if len(groups) == 1:
        raise LeaderboardError("one --group compares with nothing; give two or more (e.g. --group reasoning=... --group other=...)")
    return groups


def build_leaderboard(
    runs: list[Run], groups: list[str] | None = None, resamples: int = DEFAULT_RESAMPLES, seed: int = 0
) -> dict:
    """Rows sorted by gap (largest first) with bootstrap intervals, group summaries and Welch tests.

    Raises:
        LeaderboardError: runs of different benchmarks, one folder twice, one model name twice, or a bad group.
    """
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
    tag_of = {m: tag for tag, models in _parse_groups(groups or [], list(names)).items() for m in models}
    rows = []
    for run in runs:
        ci = paired_bootstrap(run.text, run.interleaved, resamples=resamples, seed=seed)
        point = _point(run.text, run.interleaved)
        rows.append({"model": run.name, "group": tag_of.get(run.name), "path": str(run.path), "n": len(run.item_ids),
                     "failed": run.failed, "skipped": run.skipped, "unpaired": run.unpaired, **point,
                     **{f"{k}_ci": None if ci[k] is None else list(ci[k]) for k in METRICS}})
    rows.sort(key=lambda r: (-r["gap"], r["model"]))
    item_sets = {tuple(r.item_ids) for r in runs}
    board = {
        "benchmark": benchmarks[0],
        "forms": list(runs[0].forms),
        "bootstrap": {"resamples": resamples, "seed": seed, "level": LEVEL, "unit": "item (both forms together)",
                      "interval": "percentile"},
        "same_items": len(item_sets) == 1,
        "rows": rows,
        "all_models": _summary([r["gap"] for r in rows]),
        "groups": {},
        "tests": [],
    }
    by_tag: dict[str, list[float]] = {}
    for r in rows:
        if r["group"] is not None:
            by_tag.setdefault(r["group"], []).append(r["gap"])
    tags = [t for t in dict.fromkeys(tag_of.values())]
    board["groups"] = {t: _summary(by_tag[t]) for t in tags}
    for a, b in combinations(tags, 2):
        try:
            test = welch_t_test(by_tag[a], by_tag[b])
        except ValueError as err:
            raise LeaderboardError(f"--group {a} vs {b}: {err}") from None
        board["tests"].append({"a": a, "b": b, **test})
    return board


def _f(v: float | None, pct: bool = False) -> str:
    if v is None:
        return "–"
    return f"{100 * v:.1f}" if pct else f"{v:.3f}"


def _ci(v: list[float] | None) -> str:
    return "–" if v is None else f"[{v[0]:.3f}, {v[1]:.3f}]"


def to_markdown(board: dict) -> str:
    """The board as a markdown table (fractions), with group means and tests (percent, as in the paper)."""
    b = board["bootstrap"]
    text_form, other = board["forms"]
    lines = [
        f"# Modality gap leaderboard ({TITLES[board['benchmark']]}, {len(board['rows'])} models, {text_form} vs {other})",
        "",
        f"95% intervals: paired bootstrap over items ({b['resamples']:,} resamples, seed {b['seed']}, percentile). "
        "Failed requests and skipped items are left out of both forms and counted, never scored as wrong.",
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
            f"| {rank} | {r['model']} | {r['group'] or ''} | {r['n']} | {r['failed']} | {r['skipped']} | {r['unpaired']} "
            f"| {_f(r['acc_text'])} | {_f(r['acc_interleaved'])} | {_f(r['gap'])} | {_ci(r['gap_ci'])} "
            f"| {_f(r['rel_gap'])} | {_ci(r['rel_gap_ci'])} | {_f(r['retention'])} | {_ci(r['retention_ci'])} |"
        )
    s = board["all_models"]
    lines += ["", f"Mean gap over {s['n']} models: {_f(s['mean'], True)}% ± {_f(s['ci_half'], True)}% "
              "(95% t interval over models)."]
    if board["groups"]:
        lines += ["", "| group | models | mean gap | ± (95% CI) | standard error |", "|---|---:|---:|---:|---:|"]
        for tag, g in board["groups"].items():
            lines.append(f"| {tag} | {g['n']} | {_f(g['mean'], True)}% | {_f(g['ci_half'], True)}% "
                         f"| {_f(g['se'], True)}% |")
        lines.append("")
        for t in board["tests"]:
            lines.append(f"Welch's t-test, {t['a']} vs {t['b']} (per-model gaps): t = {t['t']:.2f}, "
                         f"dof = {t['dof']:.1f}, p = {t['p']:.3g}")
    return "\n".join(lines) + "\n"


def _write_csv(board: dict, path: Path) -> None:
    fields = ["rank", "model", "group", "n", "failed", "skipped", "unpaired"]
    for k in METRICS:
        fields += [k, f"{k}_lo", f"{k}_hi"]
    fields.append("path")
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, fieldnames=fields)
        writer.writeheader()
        for rank, r in enumerate(board["rows"], start=1):
            row = {k: r[k] for k in ("model", "group", "n", "failed", "skipped", "unpaired", "path")} | {"rank": rank}
            for k in METRICS:
                lo, hi = r[f"{k}_ci"] or (None, None)
                row |= {k: r[k], f"{k}_lo": lo, f"{k}_hi": hi}
            writer.writerow(row)


def plot_gaps(board: dict, path: Path) -> list[str]:
    """Horizontal bars of the gap (%) per model with interval whiskers, largest gap on top.

    Returns:
        The model names as drawn, top to bottom (read back from the figure's axis).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = board["rows"]
    tags = list(board["groups"])
    colors = dict(zip(tags, plt.get_cmap("tab10").colors))
    fig, ax = plt.subplots(figsize=(7, 1.2 + 0.32 * len(rows)))
    ys = np.arange(len(rows))[::-1]  # row 0 (largest gap) at the top
    gaps = np.array([100 * r["gap"] for r in rows])
    lo = np.array([100 * r["gap_ci"][0] for r in rows])
    hi = np.array([100 * r["gap_ci"][1] for r in rows])
    bar_colors = [colors.get(r["group"], "#4c72b0") for r in rows]
    ax.barh(ys, gaps, color=bar_colors, height=0.7)
    ax.errorbar(gaps, ys, xerr=[gaps - lo, hi - gaps], fmt="none", ecolor="black", capsize=2, linewidth=0.8)
    ax.set_yticks(ys, [r["model"] for r in rows], fontsize=8)
    ax.axvline(0, color="black", linewidth=0.6)
    ax.set_xlabel(f"modality gap: acc {board['forms'][0]} − acc {board['forms'][1]} (%), 95% paired-bootstrap CI")
    ax.set_title(f"{TITLES[board['benchmark']]}: modality gap per model")
    ax.grid(axis="x", alpha=0.3)
    if tags:
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=colors[t], label=t) for t in tags], fontsize=8, loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    ticks = sorted(zip(ax.get_yticks(), (t.get_text() for t in ax.get_yticklabels())), reverse=True)
    plt.close(fig)
    return [label for _, label in ticks]


# ----------------------------------------------------------------------------- command


def _parser() -> argparse.ArgumentParser:
    from tokenswap.inputs import non_negative_int, positive_int

    p = argparse.ArgumentParser(
        prog="tokenswap leaderboard", description="many evaluated models: one gap table and figure"
    )
    p.add_argument("results", nargs="+", metavar="RESULT",
                   help="a tokenswap/crossmath/rest eval --out folder, or NAME=FOLDER to name the model")
    p.add_argument("--out", default="leaderboard", help="folder for leaderboard.{md,json,csv,png} (default: leaderboard)")
    # One group per flag: RESULT folders may then follow a --group without being read as groups.
    p.add_argument("--group", action="append", default=[], metavar="TAG=MODEL,MODEL",
                   help="a group of models; repeat the flag for each group (two or more: Welch's t-test of their gaps)")
    p.add_argument("--resamples", type=positive_int, default=DEFAULT_RESAMPLES,
                   help=f"bootstrap resamples (default: {DEFAULT_RESAMPLES})")
    p.add_argument("--seed", type=non_negative_int, default=0, help="bootstrap seed (default: 0)")
    return p


def cli_main(argv: list[str]) -> int:
    """Entry point of ``tokenswap leaderboard``; returns the exit status (2 for unreadable input)."""
    args = _parser().parse_args(argv)
    runs = [load_run(spec) for spec in args.results]
    board = build_leaderboard(runs, args.group, args.resamples, args.seed)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    markdown = to_markdown(board)
    (out / "leaderboard.md").write_text(markdown, encoding="utf-8")
    (out / "leaderboard.json").write_text(json.dumps(board, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    _write_csv(board, out / "leaderboard.csv")
    plot_gaps(board, out / "leaderboard.png")
    print(markdown)
    print(f"wrote {out}/leaderboard.md, .json, .csv, .png")
    return 0

