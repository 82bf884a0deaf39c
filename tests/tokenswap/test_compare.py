"""tokenswap compare: runs read from recipe folders, empty logs skipped, paired per-seed differences."""

from __future__ import annotations

import json
import math

import pytest

from tokenswap.compare import cli_main, compare_runs, load_run, paired_difference
from tokenswap.eval.stats import t_quantile


def _run_dir(root, arm, seed, gap, acc_i, pair="p"):
    out = root / f"{arm}-{seed}"
    out.mkdir(parents=True)
    (out / "tokenswap_config.json").write_text(json.dumps({"run": {"pair": pair, "arm": arm, "seed": seed}}))
    history = [{"step": 1, "loss": 2.0}, {"step": 2, "gap/abs": gap, "gap/acc_interleaved": acc_i}]
    (out / "log_history.json").write_text(json.dumps(history))
    return out


def test_paired_difference_is_per_seed_with_a_t_interval(tmp_path):
    text = {0: 0.50, 1: 0.40, 2: 0.45, 3: 0.60}
    diff = {0: -0.10, 1: -0.05, 2: -0.12, 3: -0.07}  # tokenswap - text, per seed
    dirs = [_run_dir(tmp_path, "text", s, g, 0.3) for s, g in text.items()]
    dirs += [_run_dir(tmp_path, "tokenswap", s, text[s] + diff[s], 0.3 + s / 100) for s in text]
    runs = [r for d in dirs for r in load_run(str(d))]
    d = paired_difference(runs, "gap/abs")
    values = [diff[s] for s in sorted(diff)]
    mean = sum(values) / 4
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / 3)
    assert d["seeds"] == [0, 1, 2, 3] and d["values"] == pytest.approx(values)
    assert d["mean"] == pytest.approx(mean) and d["ci95"] == pytest.approx(t_quantile(0.975, 3) * sd / 2)
    # The seeds' shared noise (text gaps 0.40-0.60) cancels: the paired CI is far narrower than the arms' CIs.
    table = compare_runs(runs, ("gap/abs", "gap/acc_interleaved"))
    paired = table["paired"]["tokenswap-text"]
    assert paired["gap/abs"]["ci95"] < table["arms"]["text"]["gap/abs"]["ci95"] / 2
    assert paired["gap/acc_interleaved"]["values"] == pytest.approx([0.0, 0.01, 0.02, 0.03])
    with pytest.raises(ValueError, match="two text runs"):
        paired_difference(runs + runs[:1], "gap/abs")


def test_compare_does_not_count_a_run_with_an_empty_log(tmp_path, capsys):
    dirs = [_run_dir(tmp_path, "text", s, 0.5 + s / 10, 0.3) for s in (0, 1)]
    dirs += [_run_dir(tmp_path, "tokenswap", s, 0.4 + s / 10, 0.3) for s in (0, 1)]
    crashed = _run_dir(tmp_path, "tokenswap", 2, 0.0, 0.0)
    (crashed / "log_history.json").write_text("[]")
    truncated = _run_dir(tmp_path, "tokenswap", 3, 0.0, 0.0)
    (truncated / "log_history.json").write_text("")
    out = tmp_path / "cmp"
    assert cli_main(["--runs", *map(str, dirs + [crashed, truncated]), "--out", str(out),
                     "--metrics", "gap/abs"]) == 0
    table = json.loads((out / "comparison.json").read_text())
    assert table["arms"]["tokenswap"]["n"] == 2
    assert table["arms"]["tokenswap"]["gap/abs"]["values"] == pytest.approx([0.4, 0.5])
    assert table["skipped"] == ["p-tokenswap", "p-tokenswap"]
    assert table["paired"]["tokenswap-text"]["gap/abs"]["seeds"] == [0, 1]
    md = (out / "comparison.md").read_text()
    assert "| paired tokenswap-text (per seed) | 2 | -0.1000 ± 0.0000 |" in md and "Skipped (empty log)" in md
    assert "Counted once" not in md


def test_runs_of_one_arm_that_are_one_replicate_count_once(tmp_path):
    """Seeds 0 and 1 of an arm with the same settings and the same logged results (run.seed reached nothing random):
    one replicate, counted once and named in one line; the JSON holds null, not NaN, where one run gives no CI."""
    dirs = [_run_dir(tmp_path, "text", s, 0.5, 0.3) for s in (0, 1)]
    dirs += [_run_dir(tmp_path, "tokenswap", s, 0.4, 0.3) for s in (0, 1)]
    out = tmp_path / "cmp"
    assert cli_main(["--runs", *map(str, dirs), "--out", str(out), "--metrics", "loss", "gap/abs"]) == 0
    text = (out / "comparison.json").read_text()
    table = json.loads(text, parse_constant=lambda c: pytest.fail(f"comparison.json holds {c}"))
    assert table["arms"]["text"]["n"] == 1 and table["arms"]["tokenswap"]["n"] == 1
    assert table["arms"]["text"]["gap/abs"]["ci95"] is None
    assert [len(s) for s in table["same_replicate"]] == [2, 2]
    md = (out / "comparison.md").read_text()
    assert "| text | 1 | 2.0000 | 0.5000 |" in md
    (line,) = [x for x in md.splitlines() if x.startswith("Counted once") and "text-0" in x]
    assert "text-1" in line and "2 runs are one replicate" in line
