"""`tokenswap leaderboard`: runs of the three evaluators -> one table, figure and group comparison.

Runs come from the real evaluators on the tiny model, or are written in their documented formats where a
test needs answers a random-weight model never gives (right answers, failed requests).
"""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest

from tokenswap.cli import main
from tokenswap.eval.gap import summarize
from tokenswap.eval.leaderboard import (
    Run,
    build_leaderboard,
    left_out,
    load_run,
    paired_bootstrap,
    plot_gaps,
    welch_t_test,
)
from tokenswap.eval.stats import t_quantile

# ----------------------------------------------------------------------------- writers of the documented formats


def _gap_run(folder, model, text, inter, extra_items=()):
    """A gap.json as `tokenswap eval` writes it (summarize(...).to_dict() of per-item records), plus extra records."""
    items = [
        {"id": f"q{i:04d}", "subject": "s", "answer": "A", "num_images": 1 + i % 3, "pred_text": "A",
         "pred_interleaved": "A" if j else "B", "correct_text": bool(t), "correct_interleaved": bool(j)}
        for i, (t, j) in enumerate(zip(text, inter))
    ]
    payload = {"model": model, "bench": "bench", "split": "test", **summarize("generate", "zero_shot", items).to_dict()}
    payload["items"] += list(extra_items)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gap.json").write_text(json.dumps(payload))
    return folder


def _pattern(n, p_text, p_inter, discordant_only=False):
    """n items with the given accuracies: text right on the first p_text*n, interleaved on the first p_inter*n."""
    k_t, k_i = round(p_text * n), round(p_inter * n)
    return [i < k_t for i in range(n)], [i < k_i for i in range(n)]


def _board(tmp_path, spec, **kw):
    runs = [load_run(str(_gap_run(tmp_path / name, name, *_pattern(n, pt, pi)))) for name, (n, pt, pi) in spec.items()]
    return build_leaderboard(runs, **kw)


def _cmd(*argv):
    return main([str(a) for a in argv])


def _lb(capsys, *argv):
    code = _cmd("leaderboard", *argv)
    out, err = capsys.readouterr()
    return code, out, err


# ----------------------------------------------------------------------------- real evaluators


def test_runs_of_the_real_evaluators_score_as_the_evaluators_do(tiny_qwen2vl, tiny_bench, tmp_path, capsys):
    """gap.json, CrossMath and REST folders written by the three real commands read back to their own numbers."""
    ts = tmp_path / "ts"
    assert _cmd("eval", "--model", tiny_qwen2vl, "--bench", tiny_bench, "--scorer", "loglik", "--batch-size", "3",
                 "--out", ts) == 0
    gap = json.loads((ts / "gap.json").read_text())
    other = _gap_run(tmp_path / "other", "other-model", [True] * 6, [True, False] * 3)
    code, out, _ = _lb(capsys, ts, other, "--out", tmp_path / "board-ts", "--resamples", 500)
    assert code == 0, out
    board = json.loads((tmp_path / "board-ts" / "leaderboard.json").read_text())
    row = next(r for r in board["rows"] if r["model"] == str(tiny_qwen2vl))
    assert (row["n"], row["failed"], row["unpaired"]) == (gap["n"], 0, 0) == (6, 0, 0)
    for key in ("acc_text", "acc_interleaved", "gap"):
        assert row[key] == pytest.approx(gap[key])
    assert board["forms"] == ["text", "interleaved"] and board["same_items"] is False

    cm_data, cm = tmp_path / "cm-data", tmp_path / "cm"
    assert _cmd("crossmath", "generate", "--n", "2", "--out", cm_data, "--styles", "original") == 0
    for modality in ("text", "image"):
        assert _cmd("crossmath", "eval", "--model", tiny_qwen2vl, "--data", cm_data / "Original", "--modality",
                     modality, "--max-new-tokens", "6", "--batch-size", "2", "--out", cm) == 0
    code, out, _ = _lb(capsys, cm, "--out", tmp_path / "board-cm", "--resamples", 200)
    assert code == 0, out
    row = json.loads((tmp_path / "board-cm" / "leaderboard.json").read_text())["rows"][0]
    for modality, key in (("text", "acc_text"), ("image", "acc_interleaved")):
        assert row[key] == json.loads((cm / f"metrics_{modality}.json").read_text())["metrics"]["macro"]
    assert (row["model"], row["n"]) == (str(tiny_qwen2vl), 2)

    rest_data, rest = tmp_path / "rest-data", tmp_path / "rest"
    assert _cmd("rest", "build", "--source", "soebench", "--n", "3", "--out", rest_data) == 0
    assert _cmd("rest", "eval", "--model", tiny_qwen2vl, "--data", rest_data, "--out", rest, "--max-new-tokens", "3",
                 "--batch-size", "3") == 0
    code, out, _ = _lb(capsys, f"tiny={rest}", "--out", tmp_path / "board-rest", "--resamples", 200)
    assert code == 0, out
    row = json.loads((tmp_path / "board-rest" / "leaderboard.json").read_text())["rows"][0]
    accuracy = json.loads((rest / "metrics.json").read_text())["variants"]["sans_200"]["all"]["accuracy"]
    assert (row["model"], row["n"], row["acc_text"], row["acc_interleaved"]) == (
        "tiny", 3, accuracy["text"], accuracy["image"])


def test_rest_right_answers_and_failed_requests(tmp_path, capsys):
    """REST predictions re-scored with the release extractor; a failed request leaves its item out of both forms."""
    from tokenswap.rest.evaluate import TEXT_VARIANT, score_predictions
    from tokenswap.rest.items import read_items

    data, run = tmp_path / "data", tmp_path / "run"
    assert _cmd("rest", "build", "--source", "soebench", "--n", "4", "--out", data) == 0
    items = read_items(data / "items.jsonl")
    run.mkdir()
    rows = []
    for k, item in enumerate(items):
        rows.append({"key": f"{item.id}|text|{TEXT_VARIANT}", "response": f"Answer: {item.gold}"})
        image = {"key": f"{item.id}|image|sans_200", "response": f"Answer: {item.gold}" if k == 0 else "no idea"}
        if k == 3:
            image = {**image, "response": None, "error": "HTTP 500 after 5 tries"}
        rows.append(image)
    (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    metrics = {"model": "m", "data": str(data), "source": "soebench", "n_items": 4, "base_variant": "sans_200"}
    (run / "metrics.json").write_text(json.dumps(metrics))

    r = load_run(str(run))
    assert (r.name, len(r.item_ids), r.failed, r.unpaired) == ("m", 3, 1, 0)
    answered = {row["key"]: row for row in rows if "error" not in row}
    for row in rows[:6]:
        answered.setdefault(row["key"].replace("|image|", "|mixed|"), row)  # score_predictions wants every modality
    expected = score_predictions(items[:3], answered, ["sans_200"], ocr=False)["sans_200"]["all"]["accuracy"]
    assert (r.text.mean(), r.interleaved.mean()) == (expected["text"], expected["image"]) == (1.0, 1 / 3)

    bad = dict(metrics, data=str(tmp_path / "moved"))
    (run / "metrics.json").write_text(json.dumps(bad))
    code, _, err = _lb(capsys, run)
    assert code == 2 and "metrics.json" in err and "moved" in err and "'data'" in err


def test_crossmath_pairs_by_puzzle_and_counts_failed_and_unpaired(tmp_path):
    folder = tmp_path / "cm"
    folder.mkdir()
    answer = "| 3 | 12 |"
    text = [{"id": f"p{i}", "model": "vlm", "prediction": ["3", "12"], "answer": answer} for i in range(6)]
    image = [{"id": "p0", "model": "vlm", "prediction": ["3", "12"], "answer": answer},
             {"id": "p1", "model": "vlm", "prediction": ["3", "13"], "answer": answer},
             {"id": "p2", "model": "vlm", "prediction": None, "answer": answer},
             {"id": "p3", "model": "vlm", "prediction": None, "answer": answer, "error": "timed out"},
             {"id": "p4", "model": "vlm", "response": None, "prediction": None, "skipped": "over --max-pixels"}]
    for modality, rows in (("text", text), ("image", image)):
        (folder / f"predictions_{modality}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (folder / f"metrics_{modality}.json").write_text(json.dumps({"model": "vlm", "modality": modality}))
    r = load_run(str(folder))
    assert (r.benchmark, r.forms, r.item_ids) == ("crossmath", ("text", "image"), ["p0", "p1", "p2"])
    assert (r.failed, r.skipped, r.unpaired) == (1, 1, 1)
    assert list(r.text) == [1.0, 1.0, 1.0] and list(r.interleaved) == [1.0, 0.0, 0.0]


# ----------------------------------------------------------------------------- failed requests


def test_failed_requests_are_left_out_of_both_forms_and_counted(tmp_path):
    text, inter = [True, True, True, False], [True, False, True, False]
    extra = [
        {"id": "e1", "num_images": 1, "error": "HTTP 429: rate limited after 5 tries"},  # no correctness at all
        {"id": "e2", "num_images": 2, "correct_text": True, "correct_interleaved": None, "error_interleaved": "timeout"},
        {"id": "e3", "num_images": 1, "correct_text": None, "correct_interleaved": None},
        {"id": "s1", "num_images": 7, "correct_text": True, "skipped_interleaved": "7 images > --max-images 6"},
        {"id": "ok", "num_images": 1, "correct_text": True, "correct_interleaved": True, "error": None,
         "skipped_images": 0, "usage": {"prompt_tokens": 9}},
    ]
    r = load_run(str(_gap_run(tmp_path / "a", "m", text, inter, extra)))
    assert (len(r.item_ids), r.failed, r.skipped) == (5, 3, 1)
    assert (r.text.mean(), r.interleaved.mean()) == (0.8, 0.6)  # scoring e1-e3 and s1 as wrong: 0.56 / 0.33
    assert left_out({"text_error": "x"}) == "failed" and left_out({"failed": True}) == "failed"
    assert left_out({"skipped": "cap"}, {"error": "500"}) == "failed"  # a failed request outranks a skip


# ----------------------------------------------------------------------------- bootstrap


def test_bootstrap_intervals_cover_the_point_and_shrink_with_n(tmp_path):
    board = _board(tmp_path, {"small": (50, 0.8, 0.6), "large": (800, 0.8, 0.6)}, resamples=4000)
    rows = {r["model"]: r for r in board["rows"]}
    for r in rows.values():
        for key in ("acc_text", "acc_interleaved", "gap", "rel_gap", "retention"):
            lo, hi = r[f"{key}_ci"]
            assert lo <= r[key] <= hi, (r["model"], key)
    for key in ("acc_text", "gap", "rel_gap"):
        small, large = (np.diff(rows[m][f"{key}_ci"])[0] for m in ("small", "large"))
        assert 3.0 < small / large < 5.3, key  # 1/sqrt(n): 16x the items, 4x narrower
    # The width is the binomial one: 2 * 1.96 * sqrt(p(1-p)/n).
    width = np.diff(rows["large"]["acc_text_ci"])[0]
    assert width == pytest.approx(2 * 1.96 * math.sqrt(0.8 * 0.2 / 800), rel=0.1)


def test_bootstrap_is_paired_over_items():
    """Forms that agree on most items: the gap's interval is that of the per-item difference, not of two samples."""
    n = 800
    text = np.array([1.0] * 640 + [0.0] * 160)
    inter = text.copy()
    inter[:80] = 0.0  # 80 discordant items: the gap is 0.1
    ci = paired_bootstrap(text, inter, resamples=4000, seed=0)
    d = text - inter
    paired = 2 * 1.96 * d.std() / math.sqrt(n)
    unpaired = 2 * 1.96 * math.sqrt(text.var() / n + inter.var() / n)
    assert ci["gap"][1] - ci["gap"][0] == pytest.approx(paired, rel=0.1)
    assert paired < 0.6 * unpaired


def test_bootstrap_is_seeded_and_a_model_interval_ignores_the_other_models(tmp_path):
    alone = _board(tmp_path / "1", {"a": (60, 0.7, 0.5)}, resamples=1000)["rows"][0]
    with_others = _board(tmp_path / "2", {"a": (60, 0.7, 0.5), "b": (90, 0.9, 0.4)}, resamples=1000)["rows"]
    assert next(r for r in with_others if r["model"] == "a")["gap_ci"] == alone["gap_ci"]
    other_seed = _board(tmp_path / "3", {"a": (60, 0.7, 0.5)}, resamples=1000, seed=1)["rows"][0]
    assert other_seed["gap_ci"] != alone["gap_ci"]
    tiny = paired_bootstrap(np.array([1.0, 0.0, 1.0]), np.array([1.0, 0.0, 0.0]), resamples=300)
    assert tiny["rel_gap"] is None and tiny["retention"] is None  # some resample has acc_text = 0
    assert tiny["gap"] is not None


# ----------------------------------------------------------------------------- Welch's t-test and groups


def _t_density_tail(t, dof, steps=400_000):
    # P(T > t) by integrating the Student-t density numerically: independent of scipy.stats.
    log_c = math.lgamma((dof + 1) / 2) - math.lgamma(dof / 2) - 0.5 * math.log(dof * math.pi)
    # substitute x = t / u, u in (0, 1]: the infinite tail becomes a finite integral
    u = (np.arange(steps) + 0.5) / steps
    x = t / u
    return float(np.sum(np.exp(log_c - (dof + 1) / 2 * np.log1p(x * x / dof)) * t / u**2) / steps)


def test_welch_against_a_hand_computation():
    # a: mean 0.2, s^2 0.01, n 3; b: mean 0.7, s^2 0.2/3, n 4. se^2 = 1/300 + 1/60 = 0.02.
    r = welch_t_test([0.1, 0.2, 0.3], [0.4, 0.6, 0.8, 1.0])
    assert r["t"] == pytest.approx(-0.5 / math.sqrt(0.02), abs=1e-12)
    assert r["dof"] == pytest.approx(0.02**2 / ((1 / 300) ** 2 / 2 + (1 / 60) ** 2 / 3), abs=1e-12)
    assert r["dof"] == pytest.approx(216 / 53, abs=1e-12)
    assert r["p"] == pytest.approx(2 * _t_density_tail(abs(r["t"]), r["dof"]), rel=1e-4)
    # Equal n and variance, dof 2: P(|T| > 2 sqrt 2) = 1 - 2 / sqrt 5 in closed form.
    assert welch_t_test([0.1, 0.3], [0.5, 0.7])["p"] == pytest.approx(1 - 2 / math.sqrt(5), abs=1e-12)
    with pytest.raises(ValueError, match="at least 2"):
        welch_t_test([0.1], [0.2, 0.3])


def _gaps_with(mean, ci_half, n):
    """n per-model gaps with this mean and 95% t half-width (mean + sd * z, z standardized)."""
    z = np.linspace(-1, 1, n)
    z = (z - z.mean()) / z.std(ddof=1)
    return list(mean + ci_half / t_quantile(0.975, n - 1) * math.sqrt(n) * z)


def test_the_papers_groups_read_as_95_ci_half_widths_give_its_t(tmp_path):
    """10.1% ± 2.2% (reasoning) vs 25.5% ± 3.7%, Welch t = -7.48: the board's "±" is that quantity."""
    # The paper does not list its groups; 10 of 42 models reasoning here (any split from 8/34 to 26/16 gives
    # t between -7.43 and -7.65 from the same "±").
    gaps = {"reasoning": _gaps_with(0.101, 0.022, 10), "non-reasoning": _gaps_with(0.255, 0.037, 32)}
    runs, groups = [], []
    for tag, values in gaps.items():
        names = []
        for k, gap in enumerate(values):
            n = 100_000  # a gap of k/n items, within 1e-5 of the wanted one
            text = np.ones(n)
            inter = np.r_[np.zeros(round(gap * n)), np.ones(n - round(gap * n))]
            names.append(f"{tag}-{k}")
            runs.append(Run(names[-1], "tokenswap", tmp_path / names[-1], ("text", "interleaved"), [], text, inter))
        groups.append(f"{tag}={','.join(names)}")
    board = build_leaderboard(runs, groups, resamples=2)
    assert board["groups"]["reasoning"]["ci_half"] == pytest.approx(0.022, abs=1e-4)
    assert board["groups"]["non-reasoning"]["ci_half"] == pytest.approx(0.037, abs=1e-4)
    assert board["tests"][0]["t"] == pytest.approx(-7.48, abs=0.02)
    # Read as standard errors the same "±" would give a t the paper does not report.
    assert -15.4 / math.hypot(2.2, 3.7) == pytest.approx(-3.58, abs=0.01)


def test_module_doctests():
    import doctest

    from tokenswap.eval import leaderboard

    result = doctest.testmod(leaderboard)
    assert result.attempted >= 4 and result.failed == 0


def test_groups_report_mean_ci_se_and_welch_through_the_cli(tmp_path, capsys):
    spec = {"think-1": (200, 0.9, 0.85), "think-2": (200, 0.9, 0.8), "think-3": (200, 0.8, 0.72),
            "plain-1": (200, 0.8, 0.5), "plain-2": (200, 0.7, 0.45), "plain-3": (200, 0.9, 0.7),
            "plain-4": (200, 0.6, 0.4)}  # fmt: skip
    folders = [_gap_run(tmp_path / name, name, *_pattern(*v)) for name, v in spec.items()]
    code, out, err = _lb(capsys, *folders, "--out", tmp_path / "board", "--resamples", 300,
                         "--group", "reasoning=think-1,think-2,think-3", "--group", "other=plain-1,plain-2,plain-3,plain-4")
    assert code == 0, err
    board = json.loads((tmp_path / "board" / "leaderboard.json").read_text())
    a = [0.05, 0.1, 0.08]
    b = [0.3, 0.25, 0.2, 0.2]
    for tag, gaps in (("reasoning", a), ("other", b)):
        g = board["groups"][tag]
        se = float(np.std(gaps, ddof=1)) / math.sqrt(len(gaps))
        assert (g["n"], g["mean"], g["se"]) == (len(gaps), pytest.approx(np.mean(gaps)), pytest.approx(se))
        assert g["ci_half"] == pytest.approx(t_quantile(0.975, len(gaps) - 1) * se)  # the paper's "±"
    (test,) = board["tests"]
    se2 = np.var(a, ddof=1) / 3 + np.var(b, ddof=1) / 4
    assert (test["a"], test["b"]) == ("reasoning", "other")
    assert test["t"] == pytest.approx((np.mean(a) - np.mean(b)) / math.sqrt(se2))
    assert "Welch's t-test, reasoning vs other" in out and f"t = {test['t']:.2f}" in out
    assert {r["model"]: r["group"] for r in board["rows"]}["think-2"] == "reasoning"


# ----------------------------------------------------------------------------- outputs and the figure


def test_table_figure_and_csv_are_sorted_by_gap(tmp_path, capsys):
    spec = {"mid": (100, 0.8, 0.6), "small": (100, 0.8, 0.75), "large": (100, 0.9, 0.4), "neg": (100, 0.5, 0.55)}
    folders = [f"{name.upper()}={_gap_run(tmp_path / name, 'same-name', *_pattern(*v))}" for name, v in spec.items()]
    code, out, err = _lb(capsys, *folders, "--out", tmp_path / "board", "--resamples", 300)
    assert code == 0, err
    order = ["LARGE", "MID", "SMALL", "NEG"]
    board = json.loads((tmp_path / "board" / "leaderboard.json").read_text())
    assert [r["model"] for r in board["rows"]] == order
    assert plot_gaps(board, tmp_path / "again.png") == order  # top to bottom as drawn
    assert (tmp_path / "board" / "leaderboard.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(tmp_path / "board" / "leaderboard.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["rank"], r["model"]) for r in rows] == [(str(i), m) for i, m in enumerate(order, start=1)]
    assert float(rows[3]["gap"]) == pytest.approx(-0.05) and float(rows[3]["gap_lo"]) < -0.05
    md = (tmp_path / "board" / "leaderboard.md").read_text()
    assert md.index("| 1 | LARGE |") < md.index("| 4 | NEG |") and "10,000" not in md and "300 resamples" in md


# ----------------------------------------------------------------------------- errors through the real CLI


def test_input_errors_exit_2_naming_the_file_and_the_fix(tmp_path, capsys):
    good = _gap_run(tmp_path / "good", "m1", [True, False], [False, False])
    other = _gap_run(tmp_path / "other", "m2", [True, True], [True, False])
    empty = tmp_path / "empty"
    empty.mkdir()
    truncated = tmp_path / "trunc"
    truncated.mkdir()
    (truncated / "gap.json").write_text((good / "gap.json").read_text()[:150])
    twin = _gap_run(tmp_path / "twin", "m1", [True], [True])
    cm = tmp_path / "cm"
    cm.mkdir()
    (cm / "predictions_text.jsonl").write_text(json.dumps({"id": "p0", "model": "m9"}) + "\n")
    torn = tmp_path / "torn"
    torn.mkdir()
    for modality in ("text", "image"):
        (torn / f"predictions_{modality}.jsonl").write_text('{"id": "p0", "model": "m", "prediction": ["1"]\n')
    cases = [
        ([empty], [str(empty), "no known result file", "gap.json"]),
        ([truncated], [str(truncated / "gap.json"), "not valid JSON", "rerun the evaluation"]),
        ([good, f"{good}/"], ["given twice", str(good)]),
        ([good, f"again={good}/gap.json"], ["given twice"]),
        ([good, twin], ["'m1'", str(twin), "NAME=PATH"]),
        ([good, cm], ["predictions_image.jsonl", "--modality image"]),
        ([torn], [str(torn / "predictions_text.jsonl") + ":1", "not valid JSON"]),
        ([tmp_path / "missing"], ["does not exist"]),
        ([good, other, "--group", "a=m1", "--group", "b=m3"], ["['m3']", "m1", "m2"]),
        ([good, other, "--group", "a=m1,m2", "--group", "b=m2"], ["'m2'", "disjoint"]),
        ([good, other, "--group", "a=m1,m2"], ["two or more"]),
        ([good, other, "--group", "a=m1", "--group", "b=m2"], ["at least 2"]),
    ]
    for argv, needles in cases:
        code, _, err = _lb(capsys, *argv, "--out", tmp_path / "board")
        assert code == 2, (argv, err)
        assert err.startswith("tokenswap leaderboard: error:") and err.count("\n") == 1, err
        for needle in needles:
            assert needle in err, (argv, needle, err)
    assert not (tmp_path / "board").exists()


def test_runs_of_two_benchmarks_are_refused(tmp_path, capsys):
    good = _gap_run(tmp_path / "good", "m1", [True], [False])
    cm = tmp_path / "cm"
    cm.mkdir()
    for modality in ("text", "image"):
        row = {"id": "p0", "model": "m2", "prediction": ["1"], "answer": "| 1 |"}
        (cm / f"predictions_{modality}.jsonl").write_text(json.dumps(row) + "\n")
    code, _, err = _lb(capsys, good, cm, "--out", tmp_path / "board")
    assert code == 2 and "different benchmarks" in err and "one per benchmark" in err

