"""`tokenswap leaderboard`: runs of the three evaluators -> one table, figure and group comparison.

Runs come from the real evaluators on the tiny model, or are written in their documented formats where a
test needs answers a random-weight model never gives (right answers, failed requests).
"""

from __future__ import annotations

import csv
import json
import math
import re

import numpy as np
import pytest

from tokenswap.cli import main
from tokenswap.eval.decompose import decompose
from tokenswap.eval.gap import summarize
from tokenswap.eval.leaderboard import (
    DEFAULT_RESAMPLES,
    MAX_RESAMPLES,
    LeaderboardError,
    Run,
    build_leaderboard,
    display_names,
    left_out,
    load_run,
    md_cell,
    paired_bootstrap,
    plot_by_images,
    plot_components,
    plot_gaps,
    welch_t_test,
)
from tokenswap.eval.leaderboard_figures import draw_gaps
from tokenswap.eval.stats import bootstrap_indices, t_quantile

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

    from tokenswap.eval import leaderboard, stats

    # welch_t_test's examples moved to stats with the test itself.
    for module, examples in ((leaderboard, 2), (stats, 8)):
        result = doctest.testmod(module)
        assert result.attempted >= examples and result.failed == 0, module


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


def test_two_runs_that_answered_alike_count_once_in_the_means_and_tests(tmp_path, capsys):
    """A second seed that reached nothing random gives the same answer on every item: one replicate, counted once in
    the group's n, the mean over models and Welch's test, and named in one line."""
    spec = {"think-1": (200, 0.9, 0.85), "think-1-seed1": (200, 0.9, 0.85), "think-2": (200, 0.9, 0.8),
            "plain-1": (200, 0.8, 0.5), "plain-2": (200, 0.7, 0.45)}  # fmt: skip
    folders = [_gap_run(tmp_path / name, name, *_pattern(*v)) for name, v in spec.items()]
    code, out, err = _lb(capsys, *folders, "--out", tmp_path / "board", "--resamples", 100,
                         "--group", "reasoning=think-1,think-1-seed1,think-2", "--group", "other=plain-1,plain-2")
    assert code == 0, err
    board = json.loads((tmp_path / "board" / "leaderboard.json").read_text())
    assert board["groups"]["reasoning"]["n"] == 2 and board["all_models"]["n"] == 4
    assert len(board["rows"]) == 5  # every run keeps its row
    assert sorted(board["same_replicate"][0]) == ["think-1", "think-1-seed1"]
    (line,) = [x for x in out.splitlines() if x.startswith("Counted once")]
    assert "think-1" in line and "think-1-seed1" in line


# ----------------------------------------------------------------------------- outputs and the figure


@pytest.mark.parametrize("resamples", ["1", "2", "0", "-3"])
def test_any_resamples_is_a_board_or_one_line(tmp_path, capsys, resamples):
    # --resamples 1 gives an interval that need not hold the point: the figure's whiskers were negative and
    # matplotlib refused them ("'xerr' must not contain negative values").
    spec = {"mid": (40, 0.8, 0.6), "small": (40, 0.8, 0.75), "large": (40, 0.9, 0.4)}
    folders = [_gap_run(tmp_path / name, name, *_pattern(*v)) for name, v in spec.items()]
    try:
        code, out, err = _lb(capsys, *folders, "--out", tmp_path / "board", "--resamples", resamples)
    except SystemExit as e:  # argparse's refusal: the usage, then one error line
        code, err = e.code, capsys.readouterr().err
    assert "Traceback" not in err
    if int(resamples) >= 1:
        assert code == 0, err
        assert (tmp_path / "board" / "leaderboard.json").exists() and list((tmp_path / "board").glob("*.png"))
    else:
        assert code == 2 and "argument --resamples: must be >= 1" in err.strip().splitlines()[-1], err


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



# ----------------------------------------------------------------------------- runs with every form (issue 31)
# A scripted model answers by fixed rules, so every number has an exact expected value. Item i shows picture
# i % P (and (i + 1) % P when it sends two images); the model identifies the pictures in `identified`; it is right
# in text on the items with i % 10 < text_tenths, in `both` where right in text except where i % load_every == 1,
# in interleaved where right in both and every picture identified, except every `lost_every`-th (the integration
# loss); its captions help on identified pictures and even items, and it reads every rendered word.

FORMS_ALL = ["text", "interleaved", "both", "caption", "rendered", "recognition"]


def _scripted(n=40, n_pictures=8, identified=range(6), text_tenths=8, load_every=10, lost_every=7,
              forms=FORMS_ALL):
    identified = set(identified)
    pictures = [{"picture": f"concept{j}#{j:08x}", "concept": f"concept{j}", "items": [],
                 "pred_recognition": "A" if j in identified else "B", "correct_recognition": j in identified,
                 "response_recognition": "Answer: A" if j in identified else "Answer: B"} for j in range(n_pictures)]
    items = []
    for i in range(n):
        shown = [i % n_pictures] if i % 3 else [i % n_pictures, (i + 1) % n_pictures]
        recognized = all(j in identified for j in shown)
        text = i % 10 < text_tenths
        both = text and (load_every == 0 or i % load_every != 1)
        correct = {"text": text, "interleaved": both and recognized and (lost_every == 0 or i % lost_every != 3),
                   "both": both, "caption": text and (recognized or i % 2 == 0), "rendered": text}
        item = {"id": f"q{i:04d}", "subject": "s", "answer": "A", "num_images": len(shown), "images_sent": len(shown),
                "pictures": [pictures[j]["picture"] for j in shown]}
        for form in FORMS_ALL[:5]:
            if form in forms:
                item |= {f"pred_{form}": "A" if correct[form] else "C", f"correct_{form}": correct[form],
                         f"response_{form}": f"Answer: {'A' if correct[form] else 'C'}"}
        if "recognition" in forms:
            item["recognized"] = recognized
        for j in shown:
            pictures[j]["items"].append(item["id"])
        items.append(item)
    return items, (pictures if "recognition" in forms else None)


def _contract_run(folder, model, items, pictures=None, excluded=(), resamples=DEFAULT_RESAMPLES, **fields):
    """A gap.json as CONTRACT_31 says `tokenswap eval --forms ...` writes it (decomposition by decompose())."""
    item_forms = [f for f in FORMS_ALL[:5] if all(f"correct_{f}" in r for r in items)]
    acc = {f"acc_{f}": sum(r[f"correct_{f}"] for r in items) / len(items) for f in item_forms}
    kinds = ["failed" if any(v.startswith("error") for v in e["forms"].values()) else "skipped" for e in excluded]
    payload = {
        "model": model, "bench": "bench", "split": "test", "scorer": "generate", "backend": "openai",
        "forms": item_forms + (["recognition"] if pictures is not None else []), "n": len(items), **acc,
        "gap": acc["acc_text"] - acc["acc_interleaved"],
        "recognition_rate": None if pictures is None else sum(p["correct_recognition"] for p in pictures) / len(pictures),
        "n_pictures": 0 if pictures is None else len(pictures), "items": items, "pictures": pictures or [],
        "excluded": list(excluded), "n_failed": kinds.count("failed"), "n_skipped": kinds.count("skipped"),
        "n_pairs": len(items) + len(excluded), "decomposition": decompose(items, pictures, resamples=resamples),
    } | fields
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "gap.json").write_text(json.dumps(payload))
    return folder


def _mean(items, key):
    return sum(r[key] for r in items) / len(items)


def test_every_form_is_a_column_with_decomposes_numbers(tmp_path, capsys):
    items, pictures = _scripted()
    only_both, _ = _scripted(identified=range(8), forms=["text", "interleaved", "both"])
    a = _contract_run(tmp_path / "a", "scripted-a", items, pictures)
    b = _contract_run(tmp_path / "b", "scripted-b", only_both)
    code, out, err = _lb(capsys, a, b, "--out", tmp_path / "board")
    assert code == 0, err
    board = json.loads((tmp_path / "board" / "leaderboard.json").read_text())
    assert board["controls"] == ["both", "caption", "rendered", "recognition"]
    rows = {r["model"]: r for r in board["rows"]}
    ra, rb = rows["scripted-a"], rows["scripted-b"]
    # The points by hand from the rules (40 items: 32 right in text, 4 of them lost to load).
    hand = {f: _mean(items, f"correct_{f}") for f in FORMS_ALL[:5]}
    assert (hand["text"], hand["both"]) == (0.8, 0.7)
    assert (ra["acc_text"], ra["acc_both"], ra["acc_caption"], ra["acc_rendered"]) == (
        hand["text"], hand["both"], hand["caption"], hand["rendered"])
    assert ra["load"] == pytest.approx(hand["text"] - hand["both"], abs=1e-12)
    assert ra["caption_recovery"] == pytest.approx(hand["caption"] - hand["interleaved"], abs=1e-12)
    assert ra["reading_recovery"] == pytest.approx(hand["rendered"] - hand["interleaved"], abs=1e-12)
    assert (ra["recognition_rate"], ra["n_pictures"]) == (6 / 8, 8)
    recognised = [r for r in items if r["recognized"]]
    assert ra["n_recognised"] == len(recognised) and ra["recognised_only_gap"] == pytest.approx(
        _mean(recognised, "correct_text") - _mean(recognised, "correct_interleaved"), abs=1e-12)
    assert ra["split_load"] + ra["split_recognition"] + ra["split_rest"] == pytest.approx(ra["gap"], abs=1e-12)
    # Intervals: the board's and gap.json's decomposition are one seeded stream (seed 0, 10,000 resamples).
    d = json.loads((a / "gap.json").read_text())["decomposition"]
    for col, e in (("acc_both", d["acc"]["both"]), ("acc_caption", d["acc"]["caption"]), ("load", d["load"]),
                   ("recognition_rate", d["recognition_rate"]), ("recognised_only_gap", d["recognised_only"]["gap"]),
                   ("split_rest", d["components"]["rest"]), ("caption_recovery", d["caption_recovery"])):
        assert (ra[col], ra[col + "_ci"]) == (e["value"], e["ci"]), col
    assert (ra["acc_text_ci"], ra["acc_interleaved_ci"]) == (d["acc"]["text"]["ci"], d["acc"]["interleaved"]["ci"])
    # The board's gap is a difference of means (today's numbers), decompose's a mean of differences: last digit.
    assert ra["gap_ci"] == pytest.approx(d["gap"]["ci"], abs=1e-12)
    # A model that ran fewer forms has those columns empty, not zero.
    assert rb["acc_caption"] is None and rb["recognition_rate"] is None and rb["load"] is not None
    md = (tmp_path / "board" / "leaderboard.md").read_text()
    assert "## What the gaps are made of" in md and "## Across models" in md
    line = next(x for x in md.splitlines() if x.startswith("| ") and "scripted-a" in x and "(8)" in x)
    assert f"{ra['acc_both']:.3f} [{ra['acc_both_ci'][0]:.3f}, {ra['acc_both_ci'][1]:.3f}]" in line
    assert f"{ra['recognition_rate']:.3f} [" in line and f"({len(recognised)})" in line
    with open(tmp_path / "board" / "leaderboard.csv") as f:
        csv_rows = {r["model"]: r for r in csv.DictReader(f)}
    assert float(csv_rows["scripted-a"]["acc_both_lo"]) == ra["acc_both_ci"][0]
    assert csv_rows["scripted-b"]["acc_caption"] == "" and csv_rows["scripted-a"]["n_pictures"] == "8"
    for name in ("leaderboard.png", "leaderboard_by_images.png", "leaderboard_components.png"):
        assert (tmp_path / "board" / name).read_bytes()[:4] == b"\x89PNG", name


def test_the_board_draws_from_decomposes_stream():
    """paired_bootstrap and decompose() resample the same items for a seed: equal intervals, today's numbers."""
    rng = np.random.default_rng(11)
    text, inter = (rng.random(137) < 0.7).astype(float), (rng.random(137) < 0.5).astype(float)
    items = [{"correct_text": bool(t), "correct_interleaved": bool(x), "images_sent": 1} for t, x in zip(text, inter)]
    for seed, resamples in ((0, 3000), (4, 20_000)):  # 20,000 x 137 spans two index chunks
        ci, d = paired_bootstrap(text, inter, resamples, seed), decompose(items, resamples=resamples, seed=seed)
        assert list(ci["acc_text"]) == d["acc"]["text"]["ci"] and list(ci["acc_interleaved"]) == d["acc"]["interleaved"]["ci"]
        assert list(ci["gap"]) == pytest.approx(d["gap"]["ci"], abs=1e-12)
    # The stream before the switch: default_rng(seed).integers(0, n, (chunk, n)) blocks of 2,000,000 // n rows.
    r = np.random.default_rng(0)
    idx = np.concatenate([r.integers(0, 137, size=(min(14598, 3000 - s), 137)) for s in range(0, 3000, 14598)])
    gap = text[idx].mean(axis=1) - inter[idx].mean(axis=1)
    assert list(paired_bootstrap(text, inter, 3000, 0)["gap"]) == list(np.percentile(gap, [2.5, 97.5]))


# ----------------------------------------------------------------------------- counts (issue 32)


def test_left_out_items_are_counted_from_excluded_and_n_fields(tmp_path, capsys):
    """A --max-images 4 run with n_skipped 5: skipped 5 and n the 26 scored, in the table, json, csv and figure."""
    items, _ = _scripted(n=31, forms=["text", "interleaved"])
    excluded = [{"id": r["id"], "forms": {"interleaved": "skipped: 5 images > --max-images 4"}} for r in items[26:]]
    capped = _contract_run(tmp_path / "capped", "capped", items[:26], excluded=excluded)
    assert json.loads((capped / "gap.json").read_text())["n_skipped"] == 5
    failed = [{"id": "f1", "forms": {"text": "error: HTTP 500 after 5 tries", "interleaved": "skipped: cap"}},
              {"id": "f2", "forms": {"interleaved": "error: timed out"}}]
    broken = _contract_run(tmp_path / "broken", "broken", items[:20], excluded=failed)
    # gap.json of before issue 31: excluded entries with "error"/"skipped" fields; n_failed counted requests.
    old = _gap_run(tmp_path / "old", "old", [True] * 10, [False] * 10)
    payload = json.loads((old / "gap.json").read_text()) | {
        "excluded": [{"id": "x1", "error": "HTTP 429", "skipped": None}, {"id": "x2", "skipped": "7 > 6"},
                     {"id": "x3", "error": "500"}], "n_failed": 3, "n_skipped": 1}
    (old / "gap.json").write_text(json.dumps(payload))
    # No excluded list: the counts eval wrote.
    counts_only = _gap_run(tmp_path / "counts", "counts", [True] * 4, [True] * 4)
    payload = json.loads((counts_only / "gap.json").read_text()) | {"n_failed": 2, "n_skipped": 7}
    (counts_only / "gap.json").write_text(json.dumps(payload))
    code, out, err = _lb(capsys, capped, broken, old, counts_only, "--out", tmp_path / "board", "--resamples", 200)
    assert code == 0, err
    board = json.loads((tmp_path / "board" / "leaderboard.json").read_text())
    got = {r["model"]: (r["n"], r["failed"], r["skipped"]) for r in board["rows"]}
    assert got == {"capped": (26, 0, 5), "broken": (20, 2, 0), "old": (10, 2, 1), "counts": (4, 2, 7)}
    assert "| capped |  | 26 | 0 | 5 | 0 |" in out
    with open(tmp_path / "board" / "leaderboard.csv") as f:
        assert {r["model"]: r["skipped"] for r in csv.DictReader(f)}["capped"] == "5"
    plt = _pyplot()
    fig, ax = plt.subplots()
    draw_gaps(ax, board)
    counts = dict(zip((t.get_text() for t in ax.get_yticklabels()), (t.get_text() for t in fig.axes[1].get_yticklabels())))
    assert counts["capped"] == "n 26, skipped 5, failed 0" and counts["broken"] == "n 20, skipped 0, failed 2"
    plt.close(fig)


def test_an_item_both_scored_and_excluded_is_refused(tmp_path, capsys):
    items, _ = _scripted(n=4, forms=["text", "interleaved"])
    run = _contract_run(tmp_path / "r", "m", items, excluded=[{"id": "q0001", "forms": {"text": "error: 500"}}])
    code, _, err = _lb(capsys, run, "--out", tmp_path / "board")
    assert code == 2 and "'q0001'" in err and "excluded" in err


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


# ----------------------------------------------------------------------------- across models (issue 31)

# Six scripted models: fewer pictures identified, a larger gap; text accuracy varies apart from that.
_FAMILY = {f"m{k}": dict(identified=range(k), text_tenths=t, load_every=e)
           for k, t, e in ((8, 8, 10), (7, 9, 5), (6, 8, 10), (5, 7, 4), (4, 8, 5), (3, 9, 10))}


def _family(tmp_path, names, forms=FORMS_ALL, resamples=500):
    runs = []
    for name in names:
        items, pictures = _scripted(forms=forms, **_FAMILY[name])
        runs.append(load_run(str(_contract_run(tmp_path / name, name, items, pictures, resamples=resamples))))
    return runs


def test_correlation_of_gap_with_recognition_across_models(tmp_path):
    from scipy import stats

    runs = _family(tmp_path, list(_FAMILY))
    board = build_leaderboard(runs, resamples=2000)
    rows = sorted(board["rows"], key=lambda r: r["model"])
    # The values by hand from the rules, not from the board.
    gap, rate, text = [], [], []
    for name in sorted(_FAMILY):
        items, pictures = _scripted(**_FAMILY[name])
        gap.append(_mean(items, "correct_text") - _mean(items, "correct_interleaved"))
        rate.append(_mean(pictures, "correct_recognition"))
        text.append(_mean(items, "correct_text"))
    assert [r["gap"] for r in rows] == pytest.approx(gap, abs=1e-12) and [r["recognition_rate"] for r in rows] == rate
    a = board["across_models"]
    c = a["gap_vs_recognition"]
    expected = stats.pearsonr(gap, rate)
    assert (c["n_models"], c["dof"]) == (6, 4) and c["r"] < -0.5
    assert c["r"] == pytest.approx(expected.statistic, abs=1e-12) and c["p"] == pytest.approx(expected.pvalue, rel=1e-9)
    assert c["ci"][0] <= c["r"] <= c["ci"][1] and -1 <= c["ci"][0] and c["ci"][1] <= 1
    # Partial r: the correlation of what is left of gap and of recognition after a line on acc_text, and its p
    # that of rate's coefficient when gap is regressed on (1, rate, text).
    res = [np.asarray(v) - np.polyval(np.polyfit(text, v, 1), text) for v in (gap, rate)]
    p_r = a["gap_vs_recognition_given_text"]
    assert p_r["r"] == pytest.approx(np.corrcoef(*res)[0, 1], abs=1e-9) and p_r["dof"] == 3
    design = np.column_stack([np.ones(6), rate, text])
    beta, ss, *_ = np.linalg.lstsq(design, np.asarray(gap), rcond=None)
    se = np.sqrt(ss[0] / 3 * np.linalg.inv(design.T @ design)[1, 1])
    assert p_r["p"] == pytest.approx(2 * stats.t.sf(abs(beta[1] / se), 3), rel=1e-6)
    # Seeded: the same board twice, another seed moves the interval but not r.
    again = build_leaderboard(runs, resamples=2000)["across_models"]["gap_vs_recognition"]
    other = build_leaderboard(runs, resamples=2000, seed=5)["across_models"]["gap_vs_recognition"]
    assert again == c and other["r"] == c["r"] and other["ci"] != c["ci"]
    # The interval resamples models: a resample of fewer than 3 distinct models (r = ±1 by arithmetic) is dropped.
    k, dropped = 6, 0
    for idx in bootstrap_indices(k, 2000, [0, 3, 0]):
        dropped += int(sum(len(set(row)) < 3 for row in idx.tolist()))
    assert c["undefined_resamples"] >= dropped > 0
    g = a["gap_vs_load"]
    loads = [r["load"] for r in rows]
    assert g["r"] == pytest.approx(stats.pearsonr([r["gap"] for r in rows], loads).statistic, abs=1e-12)


def test_too_few_models_for_a_correlation_say_so(tmp_path, capsys):
    two = _family(tmp_path / "a", ["m8", "m3"]) + _family(tmp_path / "a", ["m5"], forms=["text", "interleaved", "both"])
    a = build_leaderboard(two, resamples=300)["across_models"]
    assert a["gap_vs_recognition"]["r"] is None and a["gap_vs_recognition"]["n_models"] == 2
    assert a["gap_vs_recognition"]["reason"] == "needs ≥ 3 models with recognition; 2 have it"
    assert a["gap_vs_recognition_given_text"]["reason"] == "needs ≥ 4 models with recognition; 2 have it"
    assert a["gap_vs_load"]["r"] is not None and a["gap_vs_load"]["ci"] is None  # 3 models: r and p, no interval
    three = build_leaderboard(_family(tmp_path / "b", ["m8", "m5", "m3"]), resamples=300)["across_models"]
    assert three["gap_vs_recognition"]["r"] is not None and three["gap_vs_recognition"]["ci"] is None
    assert "interval needs ≥ 4 models" in three["gap_vs_recognition"]["reason"]
    assert three["gap_vs_recognition_given_text"]["r"] is None
    folders = [tmp_path / "a" / n for n in ("m8", "m3", "m5")]
    code, out, err = _lb(capsys, *folders, "--out", tmp_path / "board", "--resamples", 300)
    assert code == 0, err
    assert "- gap vs recognition rate (Pearson): n/a (needs ≥ 3 models with recognition; 2 have it)" in out
    assert "controlling for acc_text (partial): n/a (needs ≥ 4 models with recognition; 2 have it)" in out
    assert "95% CI n/a (interval needs ≥ 4 models" in out


# ----------------------------------------------------------------------------- figures


def test_figures_draw_the_curves_the_split_and_a_zero_gap(tmp_path):
    runs = _family(tmp_path, ["m8", "m6", "m3"])
    items, pictures = _scripted(identified=range(5))
    for r in items:  # `both` right on six items wrong in text, wrong on four: a negative load
        if r["id"] in ("q0008", "q0009", "q0018", "q0019", "q0028", "q0029"):
            r["correct_both"] = True
    runs.append(load_run(str(_contract_run(tmp_path / "neg", "negative-load", items, pictures, resamples=300))))
    flat, _ = _scripted(identified=range(8), load_every=0, lost_every=0, forms=["text", "interleaved"])
    runs.append(load_run(str(_contract_run(tmp_path / "flat", "/srv/models/Flat-VL-7B/checkpoint-9", flat))))
    board = build_leaderboard(runs, resamples=300)
    rows = {r["label"]: r for r in board["rows"]}
    assert "Flat-VL-7B/checkpoint-9" in rows and rows["Flat-VL-7B/checkpoint-9"]["gap"] == 0.0

    curves = plot_by_images(board, tmp_path / "by_images.png")
    assert set(curves) == set(rows)
    for label, drawn in curves.items():
        groups = sorted((int(k), g) for k, g in rows[label]["by_images_sent"].items())
        assert [round(x) for x in drawn["x"]] == [k for k, _ in groups] == [1, 2]
        assert drawn["y"] == pytest.approx([100 * g["gap"]["value"] for _, g in groups])
        assert drawn["lo"] == pytest.approx([100 * g["gap"]["ci"][0] for _, g in groups])
        assert drawn["hi"] == pytest.approx([100 * g["gap"]["ci"][1] for _, g in groups])

    split = plot_components(board, tmp_path / "components.png")
    assert set(split) == {"m8", "m6", "m3", "negative-load"}  # the flat run ran no control
    for label, parts in split.items():
        r = rows[label]
        assert set(parts) == {"load", "recognition", "rest", "gap"}
        signed = {p: (x[1] - x[0]) * (1 if x[0] >= 0 else -1) for p, x in parts.items() if p != "gap"}
        for p, v in signed.items():
            assert v == pytest.approx(100 * r[f"split_{p}"], abs=1e-9), (label, p)
        assert sum(signed.values()) == pytest.approx(parts["gap"], abs=1e-9) == pytest.approx(100 * r["gap"])
    assert split["negative-load"]["load"][1] <= 0 < split["negative-load"]["recognition"][1]
    assert rows["negative-load"]["split_load"] < 0

    plt = _pyplot()
    fig, ax = plt.subplots()
    draw_gaps(ax, board)
    (marker,) = [line for line in ax.lines if line.get_marker() == "D"]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    at = dict(zip(marker.get_ydata(), marker.get_xdata()))
    zero_y = ax.get_yticks()[labels.index("Flat-VL-7B/checkpoint-9")]
    assert at[zero_y] == 0.0 and ax.get_xlim()[0] < 0  # a zero gap has a marker, off the axis edge
    plt.close(fig)
    for name in ("by_images.png", "components.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert plot_components(build_leaderboard(runs[-1:], resamples=50), tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()


# ----------------------------------------------------------------------------- names


def test_served_models_named_by_a_path_are_shown_by_their_last_components(tmp_path, capsys):
    a = _gap_run(tmp_path / "a", "/srv/ckpt/run-1/checkpoint-500", [True, True], [True, False])
    b = _gap_run(tmp_path / "b", "/srv/ckpt/run-2/checkpoint-500", [True, True], [False, False])
    hub = _gap_run(tmp_path / "hub", "Qwen/Qwen2-VL-7B-Instruct", [True, True], [True, True])
    four = _gap_run(tmp_path / "four", "four", [True, False], [True, False])
    code, out, err = _lb(capsys, a, b, hub, four, "--out", tmp_path / "board", "--resamples", 50,
                         "--group", "x=run-1/checkpoint-500,four", "--group", "y=Qwen/Qwen2-VL-7B-Instruct,run-2/checkpoint-500")
    assert code == 0, err
    board = json.loads((tmp_path / "board" / "leaderboard.json").read_text())
    assert {r["model"]: r["label"] for r in board["rows"]} == {
        "/srv/ckpt/run-1/checkpoint-500": "run-1/checkpoint-500", "/srv/ckpt/run-2/checkpoint-500": "run-2/checkpoint-500",
        "Qwen/Qwen2-VL-7B-Instruct": "Qwen/Qwen2-VL-7B-Instruct", "four": "four"}
    assert "/srv/ckpt" not in (tmp_path / "board" / "leaderboard.md").read_text()
    assert plot_gaps(board, tmp_path / "g.png") == ["run-2/checkpoint-500", "run-1/checkpoint-500",
                                                     "Qwen/Qwen2-VL-7B-Instruct", "four"]
    assert {r["model"]: r["group"] for r in board["rows"]}["/srv/ckpt/run-2/checkpoint-500"] == "y"
    assert display_names(["/a/x/ckpt", "/b/x/ckpt", "/c/y/ckpt"]) == ["a/x/ckpt", "b/x/ckpt", "y/ckpt"]


def test_a_model_name_cannot_forge_a_table_row_or_a_formula(tmp_path, capsys):
    forged = "evil | 1 | 0 |\n| 1 | GPT-5 `x` | $\\frac{"
    a = _gap_run(tmp_path / "a", forged, [True, True], [False, True])
    b = _gap_run(tmp_path / "b", "=HYPERLINK(\"http://x\")", [True, True], [True, True])
    odd = _gap_run(tmp_path / "odd", "bytes-\udcff", [True], [True])  # a lone surrogate: no UTF-8 for it
    code, out, err = _lb(capsys, a, b, odd, "--out", tmp_path / "board", "--resamples", 50)
    assert code == 0, err
    assert md_cell("bytes-\udcff") == "bytes-\\\\udcff" and "bytes-\\\\udcff" in out
    md = (tmp_path / "board" / "leaderboard.md").read_text()
    lines = md.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| # | model | group |")) + 2
    table = lines[start : lines.index("", start)]
    # Three rows of 15 cells each: 16 pipes that are not escaped (a backslash pair escapes itself).
    assert len(table) == 3 and all(re.findall(r"\\.|\|", line).count("|") == 16 for line in table), table
    assert md_cell(forged) == "evil \\| 1 \\| 0 \\|\\\\n\\| 1 \\| GPT-5 \\`x\\` \\| $\\\\frac{"
    with open(tmp_path / "board" / "leaderboard.csv", newline="") as f:
        rows = {r["label"]: r for r in csv.DictReader(f)}
    assert rows[forged]["model"] == forged  # the newline survives, quoted
    assert rows["'=HYPERLINK(\"http://x\")"]["model"].startswith("'=")
    assert plot_gaps(json.loads((tmp_path / "board" / "leaderboard.json").read_text()), tmp_path / "g.png")


# ----------------------------------------------------------------------------- bad input (issue 32)


def test_bad_leaderboard_inputs_are_one_line_errors(tmp_path, capsys):
    def crossmath(name, text_lines, image_lines):
        folder = tmp_path / name
        folder.mkdir()
        for modality, lines in (("text", text_lines), ("image", image_lines)):
            (folder / f"predictions_{modality}.jsonl").write_text("".join(line + "\n" for line in lines))
        return folder

    ok = json.dumps({"id": "p0", "model": "m", "prediction": ["1"], "answer": "| 1 |"})
    not_object = crossmath("not-object", [ok, "[1, 2]"], [ok])
    number = crossmath("number", [ok], ["5"])
    empty = crossmath("empty", [], [])
    half_empty = crossmath("half-empty", [ok], [])
    bad_cells = crossmath("bad-cells", [ok], [json.dumps({"id": "p0", "model": "m", "prediction": 5, "answer": "| 1 |"})])
    deep_line = crossmath("deep-line", [ok], ["[" * 100_000 + "]" * 100_000])
    digits_line = crossmath("digits-line", [ok], ['{"id": "p0", "n": ' + "9" * 4301 + "}"])
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "gap.json").write_text("[" * 100_000 + "]" * 100_000)
    digits = _gap_run(tmp_path / "digits", "m", [True], [True])
    (digits / "gap.json").write_text((digits / "gap.json").read_text()[:-1] + ', "n_pairs": ' + "9" * 4301 + "}")
    folder = tmp_path / "folder-gap"
    (folder / "gap.json").mkdir(parents=True)
    good = _gap_run(tmp_path / "good", "m1", [True, False], [False, False])
    items, _ = _scripted(n=4, forms=["text", "interleaved"])
    bad_forms = _contract_run(tmp_path / "bad-forms", "m", items, forms=["text", "interleaved", "telepathy"])
    no_pictures = _contract_run(tmp_path / "no-pictures", "m", *_scripted(n=4))
    payload = json.loads((no_pictures / "gap.json").read_text())
    del payload["pictures"]
    (no_pictures / "gap.json").write_text(json.dumps(payload))
    file_out = tmp_path / "a-file"
    file_out.write_text("")
    cases = [
        ([not_object], [str(not_object / "predictions_text.jsonl") + ":2", "not an object", "delete that line"]),
        ([number], [str(number / "predictions_image.jsonl") + ":1", "JSON int"]),
        ([empty], [str(empty / "predictions_text.jsonl"), "empty", "tokenswap crossmath eval --modality text"]),
        ([half_empty], [str(half_empty / "predictions_image.jsonl"), "empty", "--modality image"]),
        ([bad_cells], ["prediction=5", "list of cells"]),
        ([deep_line], [str(deep_line / "predictions_image.jsonl") + ":1", "nested too deeply"]),
        ([digits_line], [str(digits_line / "predictions_image.jsonl") + ":1", "4300", "rerun"]),
        ([deep], [str(deep / "gap.json"), "nested too deeply", "rerun the evaluation"]),
        ([digits], [str(digits / "gap.json"), "4300", "rerun the evaluation"]),
        ([folder], [str(folder / "gap.json"), "is a folder"]),
        ([good, "--resamples", "1000000000"], ["--resamples 1000000000", "100,000", "at most 100000"]),
        ([bad_forms], [str(bad_forms / "gap.json"), "'telepathy'", "--forms"]),
        ([no_pictures], [str(no_pictures / "gap.json"), "'pictures'"]),
    ]
    for argv, needles in cases:
        code, _, err = _lb(capsys, *argv, "--out", tmp_path / "board")
        assert code == 2, (argv, err)
        assert err.startswith("tokenswap leaderboard: error:") and err.count("\n") == 1, err
        for needle in needles:
            assert needle in err, (argv, needle, err)
    assert not (tmp_path / "board").exists()
    code, _, err = _lb(capsys, good, "--out", file_out / "sub", "--resamples", 10)
    assert code == 2 and err.count("\n") == 1 and "--out" in err and "writable" in err
    with pytest.raises(LeaderboardError, match="at most 100000"):
        build_leaderboard([load_run(str(good))], resamples=MAX_RESAMPLES + 1)


def test_doctests_of_the_new_modules():
    import doctest

    from tokenswap.eval import leaderboard_runs, stats

    for module in (stats, leaderboard_runs):
        result = doctest.testmod(module)
        assert result.attempted >= 1 and result.failed == 0, module


def test_bad_rest_inputs_are_one_line_errors(tmp_path, capsys):
    from tokenswap.rest.evaluate import TEXT_VARIANT
    from tokenswap.rest.items import read_items

    data, run = tmp_path / "data", tmp_path / "run"
    assert _cmd("rest", "build", "--source", "soebench", "--n", "2", "--out", data) == 0
    run.mkdir()
    rows = [{"key": f"{item.id}|{form}|{variant}", "response": "Answer: 1"} for item in read_items(data / "items.jsonl")
            for form, variant in (("text", TEXT_VARIANT), ("image", "sans_200"))]
    metrics = {"model": "m", "data": str(data), "source": "soebench", "n_items": 2, "base_variant": "sans_200"}

    def write(rows, metrics):
        (run / "predictions.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (run / "metrics.json").write_text(json.dumps(metrics))

    write(rows, metrics)
    assert _lb(capsys, run, "--out", tmp_path / "ok", "--resamples", 20)[0] == 0
    items_text = (data / "items.jsonl").read_text()
    cases = [
        (lambda: write([rows[0] | {"response": {"text": "1"}}] + rows[1:], metrics), ["predictions.jsonl", "response="]),
        (lambda: write(rows, metrics | {"n_items": "2"}), ["metrics.json", "'n_items'", "int"]),
        (lambda: (write(rows, metrics), (data / "items.jsonl").write_text(items_text[: len(items_text) // 2])),
         ["items.jsonl", "rest build"]),
    ]
    for prepare, needles in cases:
        prepare()
        code, _, err = _lb(capsys, run, "--out", tmp_path / "board")
        assert code == 2 and err.count("\n") == 1, err
        for needle in needles:
            assert needle in err, (needle, err)


@pytest.mark.parametrize("case", ["one-model group", "no variance", "undecomposable run"])
def test_refusals_come_before_the_first_resample(tmp_path, case):
    """A group too small for Welch's test, a group pair without variance, or a run decompose() cannot read is
    refused before any model is bootstrapped (models of 2,000 items: a 16 MB index matrix each)."""
    import tracemalloc

    n = 2000

    def run(name, wrong, records=None, shift=0):
        inter = np.roll(np.r_[np.zeros(wrong), np.ones(n - wrong)], shift)  # shift: same gap, other items
        return Run(name, "tokenswap", tmp_path / name, ("text", "interleaved"), [f"q{i}" for i in range(n)],
                   np.ones(n), inter, records=records)

    bad_records = [{"id": f"q{i}", "correct_text": True, "correct_interleaved": True, "images_sent": "1"}
                   for i in range(n)]
    runs, groups, message = {
        "one-model group": ([run("m1", 100), run("m2", 300), run("m3", 500)], ["a=m1", "b=m2,m3"],
                            "at least 2 values per group"),
        "no variance": ([run("m1", 100), run("m2", 100, shift=1), run("m3", 300), run("m4", 300, shift=1)], ["a=m1,m2", "b=m3,m4"],
                        "zero variance"),
        "undecomposable run": ([run("m1", 100), run("m2", 300), run("m3", 0, bad_records)], None, "images_sent"),
    }[case]
    tracemalloc.start()
    try:
        with pytest.raises(LeaderboardError, match=message):
            build_leaderboard(runs, groups, resamples=DEFAULT_RESAMPLES)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 4_000_000
