"""The Student-t quantile and CI (scipy.stats) against published values, and the arguments refused."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tokenswap.eval.stats import mean_ci, paired_differences, t_cdf, t_quantile

# Two-sided 95% (p = 0.975) and 99% (p = 0.995) quantiles, from standard tables (R's qt to 10 digits).
T975 = {1: 12.7062047362, 2: 4.3026527297, 3: 3.1824463053, 4: 2.7764451052, 9: 2.2621571628,
        11: 2.2009851601, 12: 2.1788128297, 20: 2.0859634473, 29: 2.0452296421, 30: 2.0422724563,
        100: 1.9839715185, 1000: 1.9623390808}
T995 = {1: 63.6567411629, 5: 4.0321429836, 30: 2.7499956536}


@pytest.mark.parametrize("df,expected", sorted(T975.items()))
def test_t_quantile_975(df, expected):
    assert t_quantile(0.975, df) == pytest.approx(expected, abs=1e-9)


@pytest.mark.parametrize("df,expected", sorted(T995.items()))
def test_t_quantile_995_and_symmetry(df, expected):
    assert t_quantile(0.995, df) == pytest.approx(expected, abs=1e-8)
    assert t_quantile(0.005, df) == pytest.approx(-expected, abs=1e-8)


def test_t_cdf_and_limits():
    assert t_cdf(0.0, 7) == 0.5
    assert t_cdf(1.0, 1) == pytest.approx(0.75)  # Cauchy: 1/2 + atan(1)/pi
    assert t_quantile(0.975, math.inf) == pytest.approx(1.959963985, abs=1e-8)
    assert t_cdf(-2.0, math.inf) == pytest.approx(0.0227501319, abs=1e-10)
    with pytest.raises(ValueError, match="quantile level"):
        t_quantile(1.0, 3)
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_cdf(1.0, 0)


def test_mean_ci_uses_the_exact_quantile_for_every_n():
    # 12 runs: the half-width is t(0.975, 11) * sd / sqrt(12), not 1.96 * sd / sqrt(12).
    values = [float(v) for v in range(12)]
    mean, half = mean_ci(values)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 11)
    assert mean == 5.5 and half == pytest.approx(2.2009851601 * sd / math.sqrt(12), rel=1e-9)
    assert math.isnan(mean_ci([3.0])[1])
    with pytest.raises(ValueError):
        mean_ci([])


def test_paired_differences_pair_by_key():
    assert paired_differences({1: 0.5, 0: 0.25}, {0: 0.0, 1: 0.75}) == [0.25, -0.25]
    with pytest.raises(ValueError, match="only left \\[2\\]"):
        paired_differences({0: 1.0, 2: 1.0}, {0: 1.0})


# ----------------------------------------------------------------------------- one owner (issue 37 item 3)


def test_no_other_eval_module_computes_its_own_statistics():
    """Quantiles, percentiles, resample streams and scipy live in eval/stats.py only: a second copy drifts."""
    import re
    from pathlib import Path

    import tokenswap.eval

    own = re.compile(r"^\s*(from scipy|import scipy)|np\.percentile\(|default_rng\(|\.ppf\(|\bt\.cdf\(|"
                     r"sqrt\(\s*va\s*\+\s*vb\)", re.M)
    found = {p.name: [m.group(0).strip() for m in own.finditer(p.read_text())]
             for p in Path(tokenswap.eval.__file__).parent.glob("*.py") if p.name != "stats.py"}
    assert {name: hits for name, hits in found.items() if hits} == {}


def test_welch_is_scipys_ttest_ind_to_the_bit():
    from scipy import stats as scipy_stats

    from tokenswap.eval.stats import welch_t_test

    rng = np.random.default_rng(7)
    for na in range(2, 12):
        for nb in range(2, 9):
            a, b = list(rng.random(na)), list(rng.random(nb))
            want = scipy_stats.ttest_ind(a, b, equal_var=False)
            assert welch_t_test(a, b) == {"t": want.statistic, "dof": want.df, "p": want.pvalue}, (a, b)


def test_pearsons_sample_r_and_p_are_scipys_to_the_bit():
    from scipy import stats as scipy_stats

    from tokenswap.eval.stats import pearson

    rng = np.random.default_rng(7)
    for k in range(3, 12):
        x, y = rng.random(k), rng.random(k)
        got, want = pearson(x, y, resamples=50), scipy_stats.pearsonr(x, y)
        assert (got["r"], got["p"]) == (want.statistic, want.pvalue), (x, y)


def test_a_group_of_equal_values_warns_nothing(recwarn):
    from tokenswap.eval.stats import welch_t_test

    r = welch_t_test([0.2, 0.2, 0.2], [0.1, 0.5])
    assert r["dof"] == pytest.approx(1.0) and not [str(w.message) for w in recwarn]


def _peak_bytes(fn) -> int:
    import tracemalloc

    tracemalloc.start()
    try:
        fn()
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return peak


@pytest.mark.parametrize("bad", ["images_sent", "picture"])
def test_decompose_refuses_bad_input_before_the_first_resample(bad):
    # 2,000 resamples of 1,000 items: one (2000, 1000) index matrix, 16 MB, is drawn before any statistic.
    from tokenswap.eval.decompose import decompose

    items = [{"id": f"q{i}", "correct_text": True, "correct_interleaved": i % 2 == 0, "images_sent": 1}
             for i in range(1000)]
    pictures = [{"picture": "p0", "correct_recognition": True}]
    if bad == "images_sent":
        items[-1]["images_sent"] = "2"
    else:
        pictures[0]["correct_recognition"] = None

    def run():
        with pytest.raises(ValueError, match="images_sent|correct_recognition"):
            decompose(items, pictures, resamples=2000)

    assert _peak_bytes(run) < 4_000_000
