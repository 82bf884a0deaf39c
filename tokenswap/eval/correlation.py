"""Correlations across the models of a leaderboard, with a bootstrap interval over models.

One value per model (its gap, its recognition rate, its text accuracy): the unit is the model, so the interval
comes from resampling *models* with replacement (``bootstrap_indices(k, resamples, [seed, 3, 0])``: the
board's seed, a stream apart from the per-item ones), and the p-value from the t distribution of the sample
correlation under "no correlation" (``scipy.stats``; exact for normally distributed values).

* :func:`pearson`: Pearson's r of two quantities; needs :data:`MIN_PEARSON` models (with two, r is ±1 always).
* :func:`partial`: the partial correlation of x and y controlling for z (the correlation of what is left of x
  and of y once each is regressed on z); needs :data:`MIN_PARTIAL` models (one more than Pearson's r: z takes a
  degree of freedom).

A resample's statistic is fixed by arithmetic, not by the models, when the resample holds fewer distinct models
than the statistic needs (two points have r = ±1; three have a partial r of ±1) or a quantity does not vary in
it (no correlation at all). Such resamples are dropped and counted (``undefined_resamples``); the interval is the
percentile interval of the others. With exactly the minimum number of models every resample kept is the sample
itself in another order, so the interval needs one model more (:data:`MIN_PEARSON` + 1 for r,
:data:`MIN_PARTIAL` + 1 for the partial r) and is None below that. With a handful of models the interval is
wide and the p-value rests on the values being normal: either says little more than "no evidence either way"
unless the correlation is very strong.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from scipy import stats as scipy_stats

from tokenswap.eval.decompose import bootstrap_indices

__all__ = ["MIN_PARTIAL", "MIN_PEARSON", "partial", "pearson"]

MIN_PEARSON = 3
MIN_PARTIAL = 4
# Sums of squared deviations below this are "no variation": the inputs are shares in [0, 1], where two distinct
# values differ by at least 1/items (squares >= 1e-12 up to a million items), while k copies of one value leave
# rounding residue of ~1e-32.
_TINY = 1e-20


def _r(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r along the last axis; NaN where x or y does not vary."""
    dx = x - x.mean(axis=-1, keepdims=True)
    dy = y - y.mean(axis=-1, keepdims=True)
    sxx, syy, sxy = (dx * dx).sum(-1), (dy * dy).sum(-1), (dx * dy).sum(-1)
    flat = (sxx < _TINY) | (syy < _TINY)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = sxy / np.sqrt(sxx * syy)
    return np.where(flat, np.nan, np.clip(r, -1.0, 1.0))


def _partial_r(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> np.ndarray:
    """r of x and y controlling for z along the last axis; NaN where undefined (z explains x or y wholly)."""
    rxy, rxz, ryz = _r(x, y), _r(x, z), _r(y, z)
    denom = (1 - rxz**2) * (1 - ryz**2)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (rxy - rxz * ryz) / np.sqrt(denom)
    return np.where(denom < 1e-12, np.nan, np.clip(r, -1.0, 1.0))


def _p_value(r: float, dof: int) -> float:
    # Two-sided p of the t statistic r * sqrt(dof / (1 - r^2)); |r| = 1 is as far from 0 as r gets.
    if abs(r) >= 1.0:
        return 0.0
    t = r * math.sqrt(dof / (1 - r * r))
    return float(2 * scipy_stats.t.sf(abs(t), dof))


def _result(kind: str, columns: list[np.ndarray], need: int, what: str, statistic, resamples: int, seed: int,
            level: float) -> dict:
    k = len(columns[0])
    out = {"kind": kind, "n_models": k, "r": None, "ci": None, "p": None, "dof": None, "resamples": resamples,
           "undefined_resamples": None, "unit": "model", "reason": None}
    if k < need:
        out["reason"] = f"needs ≥ {need} models with {what}; {k} {'has' if k == 1 else 'have'} it"
        return out
    r = float(statistic(*columns))
    if not math.isfinite(r):
        out["reason"] = "undefined: a quantity is the same for every model" if kind == "pearson" else \
            "undefined: the control explains a quantity wholly"
        return out
    dof = k - 2 if kind == "pearson" else k - 3
    out.update(r=r, p=_p_value(r, dof), dof=dof)
    if k == need:
        out["reason"] = f"interval needs ≥ {need + 1} models (with {need} every resample kept is the sample itself)"
        return out
    chunks = []
    for idx in bootstrap_indices(k, resamples, [seed, 3, 0]):
        ordered = np.sort(idx, axis=1)
        distinct = 1 + (np.diff(ordered, axis=1) != 0).sum(axis=1)
        chunks.append(np.where(distinct >= need, statistic(*(c[idx] for c in columns)), np.nan))
    draws = np.concatenate(chunks)
    defined = draws[np.isfinite(draws)]
    out["undefined_resamples"] = int(draws.size - defined.size)
    if defined.size:
        lo, hi = np.percentile(defined, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
        out["ci"] = [float(lo), float(hi)]
    return out


def pearson(x: Sequence[float], y: Sequence[float], resamples: int, seed: int = 0, level: float = 0.95,
            what: str = "both values") -> dict:
    """Pearson's r of x and y over models, a percentile interval from resampling models, and its p-value.

    Args:
        x: one value per model.
        y: one value per model, same order.
        resamples: bootstrap resamples of the models.
        seed: the board's seed.
        level: interval coverage.
        what: what a model needs to be counted, for the refusal ("recognition").

    Returns:
        ``{"kind": "pearson", "n_models", "r", "ci", "p", "dof", "resamples", "undefined_resamples", "unit",
        "reason"}``; ``r`` is None (and ``reason`` says why) under :data:`MIN_PEARSON` models or when x or y
        does not vary.

    >>> d = pearson([0.1, 0.2, 0.3, 0.4], [0.9, 0.7, 0.8, 0.5], resamples=200)  # r, p as scipy.stats.pearsonr
    >>> round(d["r"], 4), round(d["p"], 4), d["dof"]
    (-0.8315, 0.1685, 2)
    >>> pearson([0.1, 0.2], [0.3, 0.4], resamples=10, what="recognition")["reason"]
    'needs ≥ 3 models with recognition; 2 have it'
    """
    cols = [np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)]
    return _result("pearson", cols, MIN_PEARSON, what, _r, resamples, seed, level)


def partial(x: Sequence[float], y: Sequence[float], z: Sequence[float], resamples: int, seed: int = 0,
            level: float = 0.95, what: str = "all three values") -> dict:
    """The partial correlation of x and y controlling for z over models, its interval and p-value.

    ``r_xy.z = (r_xy - r_xz r_yz) / sqrt((1 - r_xz²)(1 - r_yz²))``, the correlation of the residuals of x and of
    y after a least-squares line on z; its t statistic has ``models - 3`` degrees of freedom.

    Args:
        x: one value per model.
        y: one value per model.
        z: the control, one value per model.
        resamples: bootstrap resamples of the models.
        seed: the board's seed.
        level: interval coverage.
        what: what a model needs to be counted, for the refusal.

    Returns:
        As :func:`pearson`, with ``kind`` ``partial``; ``r`` is None under :data:`MIN_PARTIAL` models.
    """
    cols = [np.asarray(v, dtype=np.float64) for v in (x, y, z)]
    return _result("partial", cols, MIN_PARTIAL, what, _partial_r, resamples, seed, level)
