"""What one model's modality gap is made of: every form's accuracy, the controls, and a split of the gap.

The forms of one bench item (see :mod:`tokenswap.eval.forms`), each scored with the same strict-match protocol:

* ``text``: the item as words; ``interleaved``: the concept spans replaced by their pictures (the gap's two ends);
* ``both``: every concept word kept and its picture inserted right after it: the visual load without losing a word;
* ``caption``: each picture replaced by the evaluated model's own caption of it, then asked as text;
* ``rendered``: each concept span replaced by a picture of the word itself rendered as text (reading, not
  recognising);
* ``recognition``: per distinct picture, "which concept does this image show?" with the four concept names as options.

Differences, each with a 95% percentile interval from a **paired bootstrap over items** (an item's forms move
together, so a difference's interval reflects the pairing; :data:`DEFAULT_RESAMPLES` resamples, seeded):

* ``gap = acc_text - acc_interleaved``;
* ``load = acc_text - acc_both``: what showing the pictures costs when no word is lost;
* ``caption_recovery = acc_caption - acc_interleaved``: what the model's own description of the pictures gives back;
* ``reading_recovery = acc_rendered - acc_interleaved``: what a picture of the word itself gives back;
* ``recognised_only`` gap: over the items whose every picture the model identified in ``recognition``;
* the gap by number of images sent (image parts of the interleaved request), each group resampled on its own.

The **split** of the gap (``components``), exact in every resample: with ``content = acc_both - acc_interleaved``
(the cost of the word being gone once the pictures are there), ``gap = load + content``; content is split by the
recognition control into the part found on items whose pictures were all identified (``rest``:
``content`` over those items, the recognised-but-not-used part, i.e. integration) and what the other items add
(``recognition = content - rest``). Without ``both`` the split is ``recognition = gap - gap_recognised`` and
``rest = gap_recognised``; without ``recognition`` it is ``load`` and ``rest = content``. These are
associations on one item set, not causes: an item whose pictures were not identified may also be a harder item.

Recognition rate: the share of distinct pictures identified, with its interval from resampling pictures.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from tokenswap.eval.forms import ITEM_FORMS
from tokenswap.eval.stats import DEFAULT_RESAMPLES, LEVEL, bootstrap_indices, percentile_interval

__all__ = ["DEFAULT_RESAMPLES", "LEVEL", "check_decomposable", "decompose", "decomposition_markdown"]


def _estimate(value: float, draws: np.ndarray, level: float) -> dict:
    return {"value": None if not math.isfinite(value) else float(value), "ci": percentile_interval(draws, level)}


@dataclass(frozen=True)
class _Items:
    """The checked per-item inputs: each form's 0/1 scores, the recognition flags, the items per images sent."""

    n: int
    forms: list[str]
    score: dict[str, np.ndarray]
    flags: np.ndarray | None
    by_sent: dict[int, np.ndarray]


def _true_false(records: Sequence[dict], key: str, what: str, id_key: str, fix: str) -> np.ndarray:
    """``records[*][key]`` as 0/1, each a bool or a ``ValueError`` naming the record (``what`` and its ``id_key``)."""
    values = []
    for i, record in enumerate(records):
        v = record.get(key)
        if not isinstance(v, bool):
            raise ValueError(f"{what} {record.get(id_key, i)!r}: {key} is {v!r}, not true/false; {fix}")
        values.append(v)
    return np.array(values, dtype=np.float64)


def _scores(items: Sequence[dict], form: str) -> np.ndarray:
    return _true_false(items, f"correct_{form}", "item", "id", "leave failed and skipped items out before decomposing")


def _read_forms(items: Sequence[dict]) -> tuple[list[str], dict[str, np.ndarray], np.ndarray | None]:
    if len(items) == 0:
        raise ValueError("decompose needs at least one item answered in every form")
    forms = [f for f in ITEM_FORMS if all(f"correct_{f}" in r for r in items)]
    for required in ("text", "interleaved"):
        if required not in forms:
            raise ValueError(f"every item needs correct_{required} (the gap's two ends); some item lacks it")
    partial = [f for f in ITEM_FORMS if f not in forms and any(f"correct_{f}" in r for r in items)]
    if partial:
        raise ValueError(f"forms {partial} are scored on some items only; leave out the items without them first")
    score = {f: _scores(items, f) for f in forms}
    flags = None
    if any("recognized" in r for r in items):
        if not all(isinstance(r.get("recognized"), bool) for r in items):
            raise ValueError("with the recognition control every item needs recognized = true/false")
        flags = np.array([r["recognized"] for r in items], dtype=np.float64)
    return forms, score, flags


def _read_images_sent(items: Sequence[dict]) -> dict[int, np.ndarray]:
    sent: dict[int, list[int]] = {}
    for i, record in enumerate(items):
        k = record.get("images_sent", record.get("num_images"))
        if not isinstance(k, int) or isinstance(k, bool):
            raise ValueError(f"item {record.get('id', i)!r}: images_sent is {k!r}, expected a whole number")
        sent.setdefault(k, []).append(i)
    return {k: np.array(sent[k]) for k in sorted(sent)}


def _read_pictures(pictures: Sequence[dict]) -> np.ndarray:
    return _true_false(pictures, "correct_recognition", "picture", "picture",
                       "leave pictures whose request failed out first")


def _read(items: Sequence[dict], pictures: Sequence[dict] | None) -> tuple[_Items, np.ndarray | None]:
    forms, score, flags = _read_forms(items)
    picture_scores = None if pictures is None else _read_pictures(pictures)
    return _Items(len(items), forms, score, flags, _read_images_sent(items)), picture_scores


def check_decomposable(items: Sequence[dict], pictures: Sequence[dict] | None = None) -> None:
    """Raise the ValueError :func:`decompose` would raise for these inputs, without drawing a resample."""
    _read(items, pictures)


def _columns(table: _Items) -> dict[str, np.ndarray]:
    """Per-item contributions: every statistic is a mean of a column (``r_``: a sum over the recognised items)."""
    score, flags = table.score, table.flags
    t, x = score["text"], score["interleaved"]
    columns: dict[str, np.ndarray] = {f"acc_{f}": s for f, s in score.items()}
    columns["gap"] = t - x
    if "both" in score:
        columns["load"] = t - score["both"]
        columns["content"] = score["both"] - x
    if "caption" in score:
        columns["caption_recovery"] = score["caption"] - x
    if "rendered" in score:
        columns["reading_recovery"] = score["rendered"] - x
    if flags is not None:
        columns |= {"r_gap": flags * (t - x), "r_text": flags * t, "r_interleaved": flags * x}
        if "both" in score:
            columns["r_content"] = flags * (score["both"] - x)
    return columns


def _statistics(table: _Items, sums: dict[str, np.ndarray], r_count: np.ndarray | float) -> dict:
    """Every statistic from the column sums of one sample or of a chunk of resamples (the split included)."""
    out = {k: v / table.n for k, v in sums.items() if not k.startswith("r_")}
    if table.flags is not None:
        with np.errstate(divide="ignore", invalid="ignore"):
            for k in sums:
                if k.startswith("r_"):
                    out[k] = np.where(r_count > 0, sums[k] / np.maximum(r_count, 1), np.nan)
        if "both" in table.score:
            out["split_rest"] = out["r_content"]
            out["split_recognition"] = out["content"] - out["r_content"]
        else:
            out["split_rest"] = out["r_gap"]
            out["split_recognition"] = out["gap"] - out["r_gap"]
    elif "both" in table.score:
        out["split_rest"] = out["content"]
    return out


def _paired_bootstrap(table: _Items, resamples: int, seed: int, level: float) -> dict[str, dict]:
    """``{statistic: est}`` of the whole item set, every interval from one paired resampling of the items."""
    columns = _columns(table)
    names = list(columns)
    matrix = np.stack(list(columns.values()))  # (k, n)
    flags = table.flags
    point = _statistics(table, dict(zip(names, matrix.sum(axis=1))), flags.sum() if flags is not None else 0.0)
    draws: dict[str, list[np.ndarray]] = {k: [] for k in point}
    for idx in bootstrap_indices(table.n, resamples, seed):
        sums = {name: matrix[j][idx].sum(axis=1) for j, name in enumerate(names)}
        r_count = flags[idx].sum(axis=1) if flags is not None else 0.0
        for k, v in _statistics(table, sums, r_count).items():
            draws[k].append(v)
    return {k: _estimate(point[k], np.concatenate(draws[k]), level) for k in point}


def _by_images_sent(table: _Items, resamples: int, seed: int, level: float) -> dict[str, dict]:
    t, x = table.score["text"], table.score["interleaved"]
    out = {}
    for k, members in table.by_sent.items():
        diff, tk, xk = (t - x)[members], t[members], x[members]
        group_draws = [[], [], []]
        # Each group resampled on its own, from its own seeded stream: its interval does not move when another
        # group gains an item.
        for idx in bootstrap_indices(len(members), resamples, [seed, 1, k]):
            for slot, values in zip(group_draws, (diff, tk, xk)):
                slot.append(values[idx].mean(axis=1))
        d_gap, d_t, d_x = (np.concatenate(g) for g in group_draws)
        out[str(k)] = {
            "n": len(members),
            "gap": _estimate(float(diff.mean()), d_gap, level),
            "acc_text": _estimate(float(tk.mean()), d_t, level),
            "acc_interleaved": _estimate(float(xk.mean()), d_x, level),
        }
    return out


def _recognition_rate(scores: np.ndarray, resamples: int, seed: int, level: float) -> dict:
    if not scores.size:
        return {"value": None, "ci": None, "n_pictures": 0}
    draws = np.concatenate([scores[idx].mean(axis=1) for idx in bootstrap_indices(len(scores), resamples, [seed, 0, 1])])
    return {**_estimate(float(scores.mean()), draws, level), "n_pictures": len(scores)}


def _result(table: _Items, est: dict[str, dict], with_pictures: bool, resamples: int, seed: int,
            level: float) -> dict:
    """The decomposition's documented shape from the estimates (a statistic whose form did not run is None)."""
    result: dict = {
        "n": table.n,
        "forms": table.forms + (["recognition"] if with_pictures else []),
        "bootstrap": {"resamples": resamples, "seed": seed, "level": level, "unit": "item (all its forms together)",
                      "interval": "percentile"},
        "acc": {f: est[f"acc_{f}"] for f in table.forms},
        **{k: est.get(k) for k in ("gap", "load", "content", "caption_recovery", "reading_recovery")},
        "recognition_rate": None,
        "recognised_only": None,
        "components": None,
        "by_images_sent": {},
    }
    if table.flags is not None:
        result["recognised_only"] = {"n": int(table.flags.sum()), "gap": est["r_gap"], "acc_text": est["r_text"],
                                     "acc_interleaved": est["r_interleaved"]}
    components = {name: est[key] for name, key in (("load", "load"), ("recognition", "split_recognition"),
                                                   ("rest", "split_rest")) if key in est}
    result["components"] = components or None
    return result


def decompose(
    items: Sequence[dict],
    pictures: Sequence[dict] | None = None,
    resamples: int = DEFAULT_RESAMPLES,
    seed: int = 0,
    level: float = LEVEL,
) -> dict:
    """Every form's accuracy, the differences and the split of the gap, each with a paired-bootstrap interval.

    Every input is checked before the first resample is drawn.

    Args:
        items: one record per item answered in every form run: ``correct_<form>`` (bool) for ``text``,
            ``interleaved`` and any other item form run; ``images_sent`` (int, else ``num_images``); with the
            recognition control, ``recognized`` (bool: every picture of the item identified).
        pictures: one record per distinct picture with ``correct_recognition`` (bool), when the control ran.
        resamples: bootstrap resamples.
        seed: bootstrap seed.
        level: interval coverage.

    Returns:
        ``{"n", "forms", "bootstrap", "acc": {form: est}, "gap", "load", "content", "caption_recovery",
        "reading_recovery", "recognition_rate", "recognised_only", "components", "by_images_sent"}``, where an
        ``est`` is ``{"value", "ci": [lo, hi] | None}`` and a difference whose form did not run is None.

    Raises:
        ValueError: no items, a form missing from some item, a non-boolean correctness, a non-integer images_sent.

    >>> items = [{"correct_text": t, "correct_interleaved": x, "correct_both": b, "images_sent": 1}
    ...          for t, x, b in [(True, False, True), (True, True, True), (False, False, False), (True, False, False)]]
    >>> d = decompose(items, resamples=200)
    >>> d["gap"]["value"], d["load"]["value"], {k: v["value"] for k, v in d["components"].items()}
    (0.5, 0.25, {'load': 0.25, 'rest': 0.25})
    """
    table, picture_scores = _read(items, pictures)
    result = _result(table, _paired_bootstrap(table, resamples, seed, level), pictures is not None, resamples, seed,
                     level)
    if picture_scores is not None:
        result["recognition_rate"] = _recognition_rate(picture_scores, resamples, seed, level)
    result["by_images_sent"] = _by_images_sent(table, resamples, seed, level)
    return result


def _fmt(e: dict | None, sign: bool = True) -> str:
    """An estimate in percentage points with its interval: ``+12.3 [+4.0, +20.1]``."""
    if e is None or e.get("value") is None:
        return "–"
    spec = "+.1f" if sign else ".1f"
    text = f"{100 * e['value']:{spec}}"
    if e.get("ci") is not None:
        lo, hi = e["ci"]
        text += f" [{100 * lo:{spec}}, {100 * hi:{spec}}]"
    return text


def decomposition_markdown(d: dict) -> str:
    """The decomposition as markdown: accuracies, differences, the split, and the gap by images sent (points)."""
    b = d["bootstrap"]
    lines = [
        f"Why the gap: {d['n']} items in every form ({', '.join(d['forms'])}); 95% intervals from a paired bootstrap "
        f"over items ({b['resamples']:,} resamples, seed {b['seed']}); points in accuracy percent.",
        "",
        "| form | accuracy (%) |",
        "|---|---|",
    ]
    for form, e in d["acc"].items():
        lines.append(f"| {form} | {_fmt(e, sign=False)} |")
    rate = d["recognition_rate"]
    if rate is not None:
        lines.append(f"| recognition ({rate['n_pictures']} pictures) | {_fmt(rate, sign=False)} |")
    lines += ["", "| difference | points | reads as |", "|---|---|---|"]
    rows = [
        ("gap = text − interleaved", d["gap"], "the modality gap"),
        ("load = text − both", d["load"], "cost of showing the pictures with every word kept"),
        ("content = both − interleaved", d["content"], "cost of the word being gone once its picture is there"),
        ("caption recovery = caption − interleaved", d["caption_recovery"], "what the model's own captions give back"),
        ("reading recovery = rendered − interleaved", d["reading_recovery"], "what a picture of the word gives back"),
    ]
    if d["recognised_only"] is not None:
        r = d["recognised_only"]
        rows.append((f"gap on recognised-only items (n {r['n']})", r["gap"], "the gap where every picture was named"))
    for name, e, meaning in rows:
        if e is not None:
            lines.append(f"| {name} | {_fmt(e)} | {meaning} |")
    if d["components"]:
        parts = ", ".join(f"{k} {_fmt(v)}" for k, v in d["components"].items())
        lines += ["", f"Split of the gap {_fmt(d['gap'])}: {parts}."]
    if d["by_images_sent"]:
        lines += ["", "| images sent | n | gap (points) |", "|---:|---:|---|"]
        for k, g in d["by_images_sent"].items():
            lines.append(f"| {k} | {g['n']} | {_fmt(g['gap'])} |")
    return "\n".join(lines) + "\n"
