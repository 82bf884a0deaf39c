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

from tokenswap.eval.forms import ENDS, ITEM_FORMS
from tokenswap.eval.stats import DEFAULT_RESAMPLES, LEVEL, bootstrap_indices, percentile_interval

__all__ = ["DEFAULT_RESAMPLES", "LEVEL", "check_decomposable", "decompose", "decomposition_markdown"]


def _estimate(value: float, draws: np.ndarray, level: float) -> dict:
    return {"value": None if not math.isfinite(value) else float(value), "ci": percentile_interval(draws, level)}


@dataclass(frozen=True)
class _Items:
    """The checked per-item inputs: each form's 0/1 scores and where it was scored (``mask``), the recognition flags
    and where they are known (``known``), the items per images sent, and the forms run on no item."""

    n: int
    forms: list[str]
    score: dict[str, np.ndarray]
    mask: dict[str, np.ndarray]
    flags: np.ndarray | None
    known: np.ndarray | None
    by_sent: dict[int, np.ndarray]
    empty: list[str]


def _true_false(records: Sequence[dict], key: str, what: str, id_key: str, fix: str,
                allow_none: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``records[*][key]`` as 0/1 and where it is given: each a bool (or None with ``allow_none``: not scored), or a
    ``ValueError`` naming the record (``what`` and its ``id_key``)."""
    values, given = [], []
    for i, record in enumerate(records):
        v = record.get(key)
        if v is None and allow_none:
            values.append(False)
            given.append(False)
            continue
        if not isinstance(v, bool):
            raise ValueError(f"{what} {record.get(id_key, i)!r}: {key} is {v!r}, not true/false; {fix}")
        values.append(v)
        given.append(True)
    return np.array(values, dtype=np.float64), np.array(given, dtype=np.float64)


def _scores(items: Sequence[dict], form: str) -> tuple[np.ndarray, np.ndarray]:
    ends = form in ENDS  # the gap's ends: every item has both
    return _true_false(items, f"correct_{form}", "item", "id", "leave failed and skipped items out before decomposing"
                       if ends else "null marks an item not scored in that form", allow_none=not ends)


def _read_forms(items: Sequence[dict]):
    if len(items) == 0:
        raise ValueError("decompose needs at least one item answered in text and interleaved")
    forms = [f for f in ITEM_FORMS if all(f"correct_{f}" in r for r in items)]
    for required in ENDS:
        if required not in forms:
            raise ValueError(f"every item needs correct_{required} (the gap's two ends); some item lacks it")
    partial = [f for f in ITEM_FORMS if f not in forms and any(f"correct_{f}" in r for r in items)]
    if partial:
        raise ValueError(f"forms {partial} are scored on some items only (no correct_<form> field on others); give "
                         "null where an item was not scored in a form")
    read = {f: _scores(items, f) for f in forms}
    empty = [f for f in forms if not read[f][1].any()]
    forms = [f for f in forms if f not in empty]
    flags = known = None
    if any("recognized" in r for r in items):
        if not all(r.get("recognized") is None or isinstance(r.get("recognized"), bool) for r in items):
            raise ValueError("with the recognition control every item needs recognized = true/false (null: unknown)")
        known = np.array([r.get("recognized") is not None for r in items], dtype=np.float64)
        flags = np.array([bool(r.get("recognized")) for r in items], dtype=np.float64)
    return forms, {f: read[f][0] for f in forms}, {f: read[f][1] for f in forms}, flags, known, empty


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
                       "leave pictures whose request failed out first")[0]


def _read(items: Sequence[dict], pictures: Sequence[dict] | None) -> tuple[_Items, np.ndarray | None]:
    forms, score, mask, flags, known, empty = _read_forms(items)
    picture_scores = None if pictures is None else _read_pictures(pictures)
    return _Items(len(items), forms, score, mask, flags, known, _read_images_sent(items), empty), picture_scores


def check_decomposable(items: Sequence[dict], pictures: Sequence[dict] | None = None) -> None:
    """Raise the ValueError :func:`decompose` would raise for these inputs, without drawing a resample."""
    _read(items, pictures)


def split_mask(table: _Items) -> np.ndarray:
    """The items the split rests on: scored in ``both`` (when it ran) with their recognition known (when it ran)."""
    m = np.ones(table.n)
    if "both" in table.score:
        m = m * table.mask["both"]
    if table.flags is not None:
        m = m * table.known
    return m


def _columns(table: _Items) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Per-item contributions and the items each rests on: every statistic is ``sum(column) / sum(mask)`` (a mean
    over its own items), so a form scored on fewer items narrows only the statistics that use it."""
    score, mask, flags = table.score, table.mask, table.flags
    t, x = score["text"], score["interleaved"]
    every = np.ones(table.n)
    columns: dict[str, tuple[np.ndarray, np.ndarray]] = {f"acc_{f}": (s * mask[f], mask[f]) for f, s in score.items()}
    columns["gap"] = (t - x, every)
    if "both" in score:
        b, m = score["both"], mask["both"]
        columns["load"] = (m * (t - b), m)
        columns["content"] = (m * (b - x), m)
    if "caption" in score:
        columns["caption_recovery"] = (mask["caption"] * (score["caption"] - x), mask["caption"])
    if "rendered" in score:
        columns["reading_recovery"] = (mask["rendered"] * (score["rendered"] - x), mask["rendered"])
    if flags is not None:
        columns |= {"r_gap": (flags * (t - x), flags), "r_text": (flags * t, flags),
                    "r_interleaved": (flags * x, flags)}
    if flags is not None or "both" in score:
        s = split_mask(table)
        columns["s_gap"] = (s * (t - x), s)
        if "both" in score:
            b = score["both"]
            columns["s_load"] = (s * (t - b), s)
            columns["s_content"] = (s * (b - x), s)
            if flags is not None:
                columns["s_r_content"] = (s * flags * (b - x), s * flags)
        if flags is not None:
            columns["s_r_gap"] = (s * flags * (t - x), s * flags)
    return columns


def _statistics(table: _Items, sums: dict[str, np.ndarray], counts: dict[str, np.ndarray]) -> dict:
    """Every statistic from the column sums of one sample or of a chunk of resamples (the split included)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        out = {k: np.where(counts[k] > 0, sums[k] / np.maximum(counts[k], 1), np.nan) for k in sums}
    if table.flags is not None and "both" in table.score:
        out["split_load"] = out["s_load"]
        out["split_rest"] = out["s_r_content"]
        out["split_recognition"] = out["s_content"] - out["s_r_content"]
    elif table.flags is not None:
        out["split_rest"] = out["s_r_gap"]
        out["split_recognition"] = out["s_gap"] - out["s_r_gap"]
    elif "both" in table.score:
        out["split_load"] = out["s_load"]
        out["split_rest"] = out["s_content"]
    return out


def _paired_bootstrap(table: _Items, resamples: int, seed: int, level: float) -> dict[str, dict]:
    """``{statistic: est}`` of the whole item set, every interval from one paired resampling of the items."""
    columns = _columns(table)
    names = list(columns)
    values = np.stack([columns[k][0] for k in names])  # (k, n)
    masks = np.stack([columns[k][1] for k in names])
    point = _statistics(table, dict(zip(names, values.sum(axis=1))), dict(zip(names, masks.sum(axis=1))))
    draws: dict[str, list[np.ndarray]] = {k: [] for k in point}
    for idx in bootstrap_indices(table.n, resamples, seed):
        # How often each item was drawn, then every column's sum in one product: the columns hold 0, 1 and -1, so the
        # sums are whole numbers, exact in any order (the same draws as summing each resample's items).
        chunk = idx.shape[0]
        drawn = np.bincount((idx + table.n * np.arange(chunk)[:, None]).ravel(), minlength=chunk * table.n)
        drawn = drawn.reshape(chunk, table.n).astype(values.dtype)
        sum_of, count_of = drawn @ values.T, drawn @ masks.T  # (chunk, k)
        sums = {name: sum_of[:, j] for j, name in enumerate(names)}
        counts = {name: count_of[:, j] for j, name in enumerate(names)}
        for k, v in _statistics(table, sums, counts).items():
            draws[k].append(v)
    n_of = dict(zip(names, (int(c) for c in masks.sum(axis=1))))
    n_of |= {"split_load": n_of.get("s_gap"), "split_recognition": n_of.get("s_gap"), "split_rest": n_of.get("s_gap")}
    return {k: {**_estimate(float(point[k]), np.concatenate(draws[k]), level), "n": n_of.get(k)} for k in point}


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
        "split": None,
        "missing": [{"form": f, "n": 0} for f in table.empty],
        "by_images_sent": {},
    }
    if table.flags is not None:
        result["recognised_only"] = {"n": int(table.flags.sum()), "gap": est["r_gap"], "acc_text": est["r_text"],
                                     "acc_interleaved": est["r_interleaved"]}
    components = {name: est[key] for name, key in (("load", "split_load"), ("recognition", "split_recognition"),
                                                   ("rest", "split_rest")) if key in est}
    result["components"] = components or None
    if components:
        uses = [f for f in ("both",) if f in table.score] + (["recognition"] if table.flags is not None else [])
        result["split"] = {"n": est["s_gap"]["n"], "gap": est["s_gap"],
                           "rests_on": f"the items scored in text, interleaved and {' and '.join(uses)}"}
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
    """The decomposition as markdown: accuracies, differences, the split, and the gap by images sent (points); each
    statistic with the items it rests on, each form run on no item named."""
    b = d["bootstrap"]
    lines = [
        f"Why the gap: {d['n']} items in text and interleaved, each other form on the items scored in it (n beside "
        f"it); 95% intervals from a paired bootstrap over items ({b['resamples']:,} resamples, seed {b['seed']}); "
        "points in accuracy percent.",
        "",
        "| form | n | accuracy (%) |",
        "|---|---:|---|",
    ]
    for form, e in d["acc"].items():
        lines.append(f"| {form} | {e.get('n', d['n'])} | {_fmt(e, sign=False)} |")
    rate = d["recognition_rate"]
    if rate is not None:
        lines.append(f"| recognised (multiple choice) | {rate['n_pictures']} pictures | {_fmt(rate, sign=False)} |")
    for m in d.get("missing", []):
        lines.append(f"| {m['form']} | 0 | – |")
    lines += ["", "| difference | n | points | reads as |", "|---|---:|---|---|"]
    rows = [
        ("gap = text − interleaved", d["gap"], "the modality gap"),
        ("load = text − both", d["load"], "cost of showing the pictures with every word kept"),
        ("content = both − interleaved", d["content"], "cost of the word being gone once its picture is there"),
        ("caption recovery = caption − interleaved", d["caption_recovery"], "what the model's own captions give back"),
        ("reading recovery = rendered − interleaved", d["reading_recovery"], "what a picture of the word gives back"),
    ]
    if d["recognised_only"] is not None:
        rows.append(("gap on recognised-only items", d["recognised_only"]["gap"],
                     "the gap where every picture was recognised (multiple choice)"))
    for name, e, meaning in rows:
        if e is not None:
            lines.append(f"| {name} | {e.get('n', d['n'])} | {_fmt(e)} | {meaning} |")
    for m in d.get("missing", []):
        uses = [name for name, form in _USES.items() if form == m["form"]]
        why = m.get("why") or f"the {m['form']} form rests on 0 items"
        lines.append(f"Not shown: {why} (of {d['n']})" + (f"; so no {', '.join(uses)}" if uses else "")
                     + "; every other row stands.")
    if d["components"]:
        parts = ", ".join(f"{k} {_fmt(v)}" for k, v in d["components"].items())
        split = d.get("split") or {"n": d["n"], "gap": d["gap"], "rests_on": "every item"}
        if split["n"] == d["n"]:
            lines += ["", f"Split of the gap {_fmt(d['gap'])}: {parts}."]
        else:
            lines += ["", f"Split on {split['n']} of the {d['n']} items ({split['rests_on']}), not of the gap above: "
                      f"the gap on those items {_fmt(split['gap'])} = {parts}."]
    if d["by_images_sent"]:
        lines += ["", "| images sent | n | gap (points) |", "|---:|---:|---|"]
        for k, g in d["by_images_sent"].items():
            lines.append(f"| {k} | {g['n']} | {_fmt(g['gap'])} |")
    return "\n".join(lines) + "\n"


# The difference each form adds, for the line naming a form that rests on no item.
_USES = {"load": "both", "content": "both", "caption recovery": "caption", "reading recovery": "rendered"}
