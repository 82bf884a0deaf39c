"""Student-t confidence intervals and tests for comparisons of a few runs per arm, on ``scipy.stats``.

The comparisons here have 2-30 runs per arm, where the normal quantile 1.96 is 4-11% too narrow: the interval
half-width is the exact Student-t quantile times the standard error. The leaderboard's cross-model analyses
(correlations, partial correlations) use ``scipy.stats`` directly.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from scipy import stats as _scipy_stats

__all__ = ["mean_ci", "paired_differences", "t_cdf", "t_quantile"]


def t_cdf(t: float, df: float) -> float:
    """P(T <= t) for Student's t with ``df`` degrees of freedom (df > 0; math.inf gives the normal)."""
    if not df > 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    if math.isinf(df):
        return float(_scipy_stats.norm.cdf(t))
    return float(_scipy_stats.t.cdf(t, df))


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
        return float(_scipy_stats.norm.ppf(p))
    return float(_scipy_stats.t.ppf(p, df))


def mean_ci(values: Sequence[float], level: float = 0.95) -> tuple[float, float]:
    """Mean and half-width of the two-sided Student-t confidence interval (NaN half-width for n < 2).

    >>> m, h = mean_ci([1.0, 2.0, 3.0])
    >>> m, round(h, 4)
    (2.0, 2.4841)
    """
    n = len(values)
    if n == 0:
        raise ValueError("mean_ci needs at least one value")
    mean = sum(values) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return mean, t_quantile(0.5 + level / 2.0, n - 1) * sd / math.sqrt(n)


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
