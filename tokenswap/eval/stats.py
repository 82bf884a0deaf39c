"""Every statistic of tokenswap in one place: the bootstrap stream, percentile intervals, Student-t summaries,
Welch's test and correlations across models, on ``scipy.stats`` wherever scipy has the computation.

Who uses what: :mod:`~tokenswap.eval.decompose` (one model's forms, a paired bootstrap over items) and
:mod:`~tokenswap.eval.leaderboard` (many models) draw from :func:`bootstrap_indices` and read intervals with
:func:`percentile_interval`, so a model's intervals agree wherever they are computed; ``tokenswap compare``, the
demo and the leaderboard's groups summarise a few values with :func:`summary` / :func:`mean_ci`.

**Few runs per arm.** The comparisons have 2-30 runs per arm, where the normal quantile 1.96 is 4-11% too narrow:
the interval half-width is the exact Student-t quantile times the standard error. Two groups are compared with
Welch's unequal-variance t-test (``scipy.stats.ttest_ind(..., equal_var=False)``).

**Correlations across models** (:func:`pearson`, :func:`partial`). One value per model (its gap, its recognition
rate, its text accuracy): the unit is the model, so the interval comes from resampling *models* with replacement
(``bootstrap_indices(k, resamples, [seed, 3, 0])``: the board's seed, a stream apart from the per-item ones), and
the p-value from the t distribution of the sample correlation under "no correlation" (exact for normally
distributed values). Pearson's r of the sample and its p are ``scipy.stats.pearsonr``'s; scipy has no partial
correlation, so that one is the formula on Pearson's r's, its p the t test with ``models - 3`` dof.

* :func:`pearson` needs :data:`MIN_PEARSON` models (with two, r is ±1 always).
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
import warnings
from collections.abc import Callable, Iterator, Sequence

import numpy as np

__all__ = ["DEFAULT_RESAMPLES", "LEVEL", "MIN_PARTIAL", "MIN_PEARSON", "bootstrap_indices", "mean_ci",
           "paired_differences", "partial", "pearson", "percentile_interval", "summary", "t_cdf", "t_quantile",
           "welch_t_test"]

DEFAULT_RESAMPLES = 10_000
LEVEL = 0.95
MIN_PEARSON = 3
MIN_PARTIAL = 4
_INDEX_BUDGET = 2_000_000  # entries of one (chunk, n) index matrix (~16 MB)
# Sums of squared deviations below this are "no variation": the inputs are shares in [0, 1], where two distinct
# values differ by at least 1/items (squares >= 1e-12 up to a million items), while k copies of one value, or one
# share reached by two roundings (0.5 - 0.2 and 0.6 - 0.3), leave residue of ~1e-32 that scipy would correlate.
_TINY = 1e-20


def _scipy_stats():
    # Imported where a test or a distribution is asked, not with this module: scipy.stats takes about a second to
    # import, and `tokenswap eval` needs only the bootstrap (numpy) at its end.
    from scipy import stats

    return stats


# ----------------------------------------------------------------------------- Student t


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (df > 0; math.inf gives the normal)."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isinf(df):
        return float(_scipy_stats().norm.cdf(t))
    return float(_scipy_stats().t.cdf(t, df))


def t_quantile(p: float, df: float) -> float:
    """The ``p`` quantile of Student's t with ``df`` degrees of freedom (inverse of :func:`t_cdf`).

    >>> round(t_quantile(0.975, 4), 4), round(t_quantile(0.975, 29), 4)
    (2.7764, 2.0452)
    """
    if not 0.0 < p < 1.0:
        raise ValueError(f"quantile level must be in (0, 1), got {p}")
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isinf(df):
        return float(_scipy_stats().norm.ppf(p))
    return float(_scipy_stats().t.ppf(p, df))


def summary(values: Sequence[float], level: float = LEVEL) -> dict[str, float | None]:
    """``{"n", "mean", "sd", "se", "ci_half"}`` of a few values: ``ci_half`` is the two-sided Student-t interval's
    half-width, the t quantile times the standard error (sd, se and ci_half are None for n < 2).

    >>> s = summary([1.0, 2.0, 3.0])
    >>> s["mean"], s["sd"], round(s["ci_half"], 4)
    (2.0, 1.0, 2.4841)

    Raises:
        ValueError: no values.
    """
    n = len(values)
    if n == 0:
        raise ValueError("a mean and interval need at least one value")
    mean = sum(values) / n
    if n < 2:
        return {"n": n, "mean": mean, "sd": None, "se": None, "ci_half": None}
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    se = sd / math.sqrt(n)
    return {"n": n, "mean": mean, "sd": sd, "se": se, "ci_half": t_quantile(0.5 + level / 2, n - 1) * se}


def mean_ci(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Mean and half-width of the two-sided Student-t confidence interval (NaN half-width for n < 2).

    >>> m, h = mean_ci([1.0, 2.0, 3.0])
    >>> m, round(h, 4)
    (2.0, 2.4841)
    """
    s = summary(values, level)
    return s["mean"], math.nan if s["ci_half"] is None else s["ci_half"]


def paired_differences(a: dict, b: dict) -> list[float]:
    """``a[k] - b[k]`` for every key both hold, in sorted key order (pairs runs by seed).

    Raises:
        ValueError: the keys differ (an unpaired run would bias the paired mean); names the keys.
    """
    if set(a) != set(b):
        raise ValueError(
            f"paired difference needs the same seeds on both sides: only left {sorted(set(a) - set(b))}, "
            f"only right {sorted(set(b) - set(a))}"
        )
    return [a[k] - b[k] for k in sorted(a)]


def welch_t_test(a: Sequence[float], b: Sequence[float]) -> dict[str, float]:
    """Welch's unequal-variance t-test of mean(a) vs mean(b) (``scipy.stats.ttest_ind(a, b, equal_var=False)``).

    t = (mean_a - mean_b) / sqrt(s_a²/n_a + s_b²/n_b), with Welch-Satterthwaite degrees of freedom and a
    two-sided p.

    >>> r = welch_t_test([0.1, 0.3], [0.5, 0.7])  # equal n and variance: dof = 2(n - 1), p = 1 - 2/sqrt(5)
    >>> round(r["t"], 6), round(r["dof"], 6), round(r["p"], 6)
    (-2.828427, 2.0, 0.105573)

    Raises:
        ValueError: a group has fewer than 2 values, or both have zero variance (t is undefined).
    """
    if len(a) < 2 or len(b) < 2:
        raise ValueError(f"Welch's t-test needs at least 2 values per group, got {len(a)} and {len(b)}")
    # Checked here, not left to scipy, which answers NaN with a warning.
    if summary(a)["se"] == 0 and summary(b)["se"] == 0:
        raise ValueError("both groups have zero variance; Welch's t is undefined")
    with warnings.catch_warnings():
        # A group of equal gaps (a legitimate zero variance) makes scipy warn of "precision loss" on stderr.
        warnings.filterwarnings("ignore", "Precision loss occurred", RuntimeWarning)
        result = _scipy_stats().ttest_ind(a, b, equal_var=False)
    return {"t": float(result.statistic), "dof": float(result.df), "p": float(result.pvalue)}


# ----------------------------------------------------------------------------- the bootstrap


def bootstrap_indices(n: int, resamples: int, seed: int | Sequence[int]) -> Iterator[np.ndarray]:
    """Resamples of ``range(n)`` with replacement, in chunks of shape ``(k, n)``; the same stream for the same seed.

    The leaderboard and :func:`~tokenswap.eval.decompose.decompose` draw from this one stream, so a model's
    intervals agree wherever they are computed.
    """
    rng = np.random.default_rng(seed)
    chunk = max(1, _INDEX_BUDGET // max(n, 1))
    for start in range(0, resamples, chunk):
        yield rng.integers(0, n, size=(min(chunk, resamples - start), n))


def percentile_interval(draws: np.ndarray, level: float = LEVEL) -> list[float] | None:
    """The percentile interval ``[lo, hi]`` of bootstrap draws; None when there are none or some is not finite
    (a statistic undefined in some resample, an empty subset, has no percentile interval).

    >>> percentile_interval(np.arange(101.0), 0.5), percentile_interval(np.array([1.0, np.nan]))
    ([25.0, 75.0], None)
    """
    if draws.size == 0 or not np.isfinite(draws).all():
        return None
    lo, hi = np.percentile(draws, [100 * (1 - level) / 2, 100 * (1 + level) / 2])
    return [float(lo), float(hi)]


# ----------------------------------------------------------------------------- correlations across models


def _r(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson's r along the last axis (one row per resample); NaN where x or y does not vary.

    scipy.stats.pearsonr gives the sample's r; the resamples need 10,000 rows at once with the :data:`_TINY`
    rule for "does not vary", which pearsonr's exact-constant test does not apply (it correlates rounding residue).
    """
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


def _varies(v: np.ndarray) -> bool:
    return float(((v - v.mean()) ** 2).sum()) >= _TINY


def _sample_pearson(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """r and its two-sided p (``scipy.stats.pearsonr``); NaN r when x or y does not vary."""
    if not (_varies(x) and _varies(y)):
        return math.nan, math.nan
    with warnings.catch_warnings():
        # Values that vary by more than _TINY are correlated as they are; scipy's warning would reach stderr.
        warnings.simplefilter("ignore", _scipy_stats().NearConstantInputWarning)
        result = _scipy_stats().pearsonr(x, y)
    return float(result.statistic), float(result.pvalue)


def _sample_partial(x: np.ndarray, y: np.ndarray, z: np.ndarray) -> tuple[float, float]:
    """The partial r (scipy has none) and the two-sided p of its t statistic with ``models - 3`` dof."""
    r = float(_partial_r(x, y, z))
    if not math.isfinite(r):
        return math.nan, math.nan
    dof = len(x) - 3
    # |r| = 1 is as far from 0 as r gets.
    p = 0.0 if abs(r) >= 1.0 else float(2 * _scipy_stats().t.sf(abs(r * math.sqrt(dof / (1 - r * r))), dof))
    return r, p


def _correlation(kind: str, columns: list[np.ndarray], need: int, what: str,
                 sample: Callable[..., tuple[float, float]], draw: Callable[..., np.ndarray], resamples: int,
                 seed: int, level: float) -> dict:
    k = len(columns[0])
    out = {"kind": kind, "n_models": k, "r": None, "ci": None, "p": None, "dof": None, "resamples": resamples,
           "undefined_resamples": None, "unit": "model", "reason": None}
    if k < need:
        out["reason"] = f"needs ≥ {need} models with {what}; {k} {'has' if k == 1 else 'have'} it"
        return out
    r, p = sample(*columns)
    if not math.isfinite(r):
        out["reason"] = "undefined: a quantity is the same for every model" if kind == "pearson" else \
            "undefined: the control explains a quantity wholly"
        return out
    out.update(r=r, p=p, dof=k - 2 if kind == "pearson" else k - 3)
    if k == need:
        out["reason"] = f"interval needs ≥ {need + 1} models (with {need} every resample kept is the sample itself)"
        return out
    chunks = []
    for idx in bootstrap_indices(k, resamples, [seed, 3, 0]):
        ordered = np.sort(idx, axis=1)
        distinct = 1 + (np.diff(ordered, axis=1) != 0).sum(axis=1)
        chunks.append(np.where(distinct >= need, draw(*(c[idx] for c in columns)), np.nan))
    draws = np.concatenate(chunks)
    defined = draws[np.isfinite(draws)]
    out["undefined_resamples"] = int(draws.size - defined.size)
    out["ci"] = percentile_interval(defined, level)
    return out


def pearson(x: Sequence[float], y: Sequence[float], resamples: int, seed: int = 0, level: float = LEVEL,
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

    >>> d = pearson([0.1, 0.2, 0.3, 0.4], [0.9, 0.7, 0.8, 0.5], resamples=200)  # r, p: scipy.stats.pearsonr
    >>> round(d["r"], 4), round(d["p"], 4), d["dof"]
    (-0.8315, 0.1685, 2)
    >>> pearson([0.1, 0.2], [0.3, 0.4], resamples=10, what="recognition")["reason"]
    'needs ≥ 3 models with recognition; 2 have it'
    """
    cols = [np.asarray(x, dtype=np.float64), np.asarray(y, dtype=np.float64)]
    return _correlation("pearson", cols, MIN_PEARSON, what, _sample_pearson, _r, resamples, seed, level)


def partial(x: Sequence[float], y: Sequence[float], z: Sequence[float], resamples: int, seed: int = 0,
            level: float = LEVEL, what: str = "all three values") -> dict:
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
    return _correlation("partial", cols, MIN_PARTIAL, what, _sample_partial, _partial_r, resamples, seed, level)
