"""``tokenswap crossmath fidelity`` on the committed released excerpts (the full set is not in the repository)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenswap.cli import main as tokenswap_main
from tokenswap.crossmath.data import load_crossmath
from tokenswap.crossmath.fidelity import (
    RELEASED_SHAPE,
    format_statistics_table,
    hop_label_agreement,
    mean_z,
    proportion_z,
    puzzle_stats,
    record_roundtrip,
    released_jsonl,
    shape_counts,
    summarize,
)

RELEASE = Path(__file__).parent / "fixtures" / "crossmath_release"


def test_statistics_of_released_records():
    records = load_crossmath(released_jsonl(RELEASE, "original"))
    stats = [puzzle_stats(r) for r in records]
    # math_puzzle_0104 (easy), 0072 (hard), 0187 (hard, ÷-bug): read off the committed records.
    assert [s.difficulty for s in stats] == ["easy", "hard", "hard"]
    assert [s.equations for s in stats] == [5, 5, 10]
    assert all(set(s.blanks_per_equation) <= {1, 2} and s.collapsed == 0 for s in stats)
    assert stats[0].hops == [1] * len(stats[0].hops)
    summary = summarize(stats)
    assert summary["all"]["n"] == 3 and summary["hard"]["n"] == 2 and summary["all"]["collapsed"] == 0
    assert abs(sum(summary["all"]["hop_share"].values()) - 1) < 1e-9
    table = format_statistics_table(summary, summary)
    assert table.splitlines()[0] == "| | released | ours |" and "blanks at hop 1" in table
    assert hop_label_agreement(records) == (sum(len(s.hops) for s in stats),) * 2


@pytest.mark.parametrize("style", ["original", "noborder", "beige", "altstyle"])
def test_released_lines_round_trip_except_the_divide_bug_puzzle(style):
    assert record_roundtrip(released_jsonl(RELEASE, style), style) == (2, 3)


def test_fidelity_command_prints_the_report(capsys, tmp_path):
    assert tokenswap_main(["crossmath", "fidelity", "--released", str(RELEASE), "--n", "6"]) == 0
    out = capsys.readouterr().out
    assert "| puzzles | 3 | 6 |" in out
    shape = out[out.index("## Shape") :]
    for label in ("blank at a / b / c, % (hard)", "grid rows, mean (all)", "numbers with 1 / 2 / 3 digits, % (all)"):
        assert f"| {label} |" in shape
    assert "operators + / - / × / ÷, % (medium)" not in shape  # no released medium puzzle among the excerpts
    assert "- Altstyle: " in out and "## Pixel parity" in out
    rows = [line for line in out.splitlines() if line.startswith("| Original |")]
    assert len(rows) == 1 and rows[0].split("|")[3].strip() == "2"  # two committed PNGs per style
    assert tokenswap_main(["crossmath", "fidelity", "--released", str(tmp_path)]) == 2
    assert "xuyige/CrossMath" in capsys.readouterr().err


def test_z_of_shares_and_means():
    assert proportion_z(50, 100, 50, 100) == 0.0 and proportion_z(0, 10, 0, 20) == 0.0
    # 40% of 300 against 50% of 200: pooled 44%, se 0.0453.
    assert proportion_z(120, 300, 100, 200) == pytest.approx(-2.207, abs=1e-3)
    assert mean_z([11.0, 3.0], 300, [12.0, 3.0], 100) == pytest.approx(-2.887, abs=1e-3)
    assert mean_z([1.0, 0.0], 5, [1.0, 0.0], 5) == 0.0


def test_released_shape_figures_are_the_committed_records_own_kind():
    """RELEASED_SHAPE holds counts the report can recompute: shares add up and the groups add up to 'all'."""
    total = RELEASED_SHAPE["all"]
    for key in ("blank_position", "digits", "operators"):
        assert [
            sum(RELEASED_SHAPE[g][key][k] for g in ("easy", "medium", "hard")) for k in range(len(total[key]))
        ] == total[key]
    assert sum(RELEASED_SHAPE[g]["n"] for g in ("easy", "medium", "hard")) == total["n"] == 250
    stats = shape_counts([puzzle_stats(r) for r in load_crossmath(released_jsonl(RELEASE, "original"))])
    assert set(stats) == {"all", "easy", "hard"} and sum(stats["all"]["blank_position"]) >= stats["all"]["n"]
