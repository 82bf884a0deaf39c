"""``tokenswap crossmath fidelity`` on the committed released excerpts (the full set is not in the repository)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tokenswap.cli import main as tokenswap_main
from tokenswap.crossmath.data import load_crossmath
from tokenswap.crossmath.fidelity import (
    format_statistics_table,
    hop_label_agreement,
    puzzle_stats,
    record_roundtrip,
    released_jsonl,
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
    assert "- Altstyle: " in out and "## Pixel parity" in out
    rows = [line for line in out.splitlines() if line.startswith("| Original |")]
    assert len(rows) == 1 and rows[0].split("|")[3].strip() == "2"  # two committed PNGs per style
    assert tokenswap_main(["crossmath", "fidelity", "--released", str(tmp_path)]) == 2
    assert "xuyige/CrossMath" in capsys.readouterr().err
