"""Grid parsing/formatting and the synchronized hop solver on hand-built puzzles."""

from __future__ import annotations

import pytest

from tokenswap.crossmath import (
    chain_of_thought,
    extract_answer,
    find_equations,
    format_markdown_table,
    parse_markdown_table,
    solve,
)
from tokenswap.crossmath.grid import apply_operator, normalize_operators, solve_for


def grid_of(*rows: str) -> list[list[str]]:
    """A grid from space-separated rows, ``.`` for an empty cell."""
    return [["" if cell == "." else cell for cell in row.split()] for row in rows]


# A four-hop chain: x1 from row 0, x2 from column 2 (needs x1), x3 from row 4 (needs x2), x4 from column 4.
CHAIN = grid_of(
    "3 + ? = 8 . .",
    ". . × . . . .",
    ". . 2 . . . .",
    ". . = . . . .",
    ". . ? - ? = 4",
    ". . . . + . .",
    ". . . . 1 . .",
    ". . . . = . .",
    ". . . . ? . .",
)


def test_format_is_the_released_text_format():
    grid = grid_of("12 + ? = 20", ". . x . .")
    assert format_markdown_table(grid) == "| 12 | + | ? | = | 20 |\n|   |   | x |   |   |"


def test_parse_accepts_operator_aliases_and_round_trips():
    text = "| 6 | x | ? | = | 12 |\n| * |   | / |   | X |\n\n| 1 | − | ÷ | × | - |"
    grid = parse_markdown_table(text)
    assert grid[0] == ["6", "×", "?", "=", "12"]
    assert grid[1] == ["×", "", "÷", "", "×"]
    assert grid[2] == ["1", "-", "÷", "×", "-"]
    assert parse_markdown_table(format_markdown_table(CHAIN)) == CHAIN


def test_parse_rejects_ragged_and_unwrapped_rows():
    with pytest.raises(ValueError, match="same number of cells"):
        parse_markdown_table("| 1 | + |\n| 2 |")
    with pytest.raises(ValueError, match="line 2 must start and end with"):
        parse_markdown_table("| 1 | + |\n2 | 3 |")


def test_find_equations_reads_across_then_down_and_rejects_long_runs():
    equations = find_equations(CHAIN)
    assert [(e.direction, e.cells[0], e.op) for e in equations] == [
        ("across", (0, 0), "+"),
        ("across", (4, 2), "-"),
        ("down", (0, 2), "×"),
        ("down", (4, 4), "+"),
    ]
    with pytest.raises(ValueError, match="5 cells"):
        find_equations(grid_of("1 + 2 = 3 + 4 = 7"))


def test_arithmetic_helpers_refuse_negative_and_inexact():
    assert apply_operator(7, "-", 9) is None
    assert apply_operator(7, "÷", 2) is None
    assert solve_for(1, "×", 0, None, 0) is None  # 0 × b = 0 leaves b open
    assert solve_for(0, "÷", None, 3, 4) == 12
    assert normalize_operators("/*x+") == "+×÷"
    with pytest.raises(ValueError, match="operators must use"):
        normalize_operators("+%")


def test_multi_hop_chain_gets_hops_one_to_four():
    solution = solve(CHAIN)
    assert solution.solved
    assert solution.blanks == [(0, 2), (4, 2), (4, 4), (8, 4)]
    assert solution.answers() == [5, 10, 6, 7]
    assert solution.answer_hops() == [1, 2, 3, 4]
    # Equation steps: across row 0 in round 1, column 2 in round 2, row 4 in round 3, column 4 in round 4.
    assert solution.equation_steps == [1, 3, 2, 4]
    assert solution.solving_steps() == {
        "step1": ["3+5=8"],
        "step2": ["5×2=10"],
        "step3": ["10-6=4"],
        "step4": ["6+1=7"],
    }


def test_synchronized_rounds_do_not_use_same_round_solutions():
    # The across equation (swept first) solves (0, 2) in round 1. A solver that updated in place would then
    # solve the down equation in the same sweep; the synchronized solver must wait for round 2.
    grid = grid_of(
        "2 + ? = 5",
        ". . × . .",
        ". . 4 . .",
        ". . = . .",
        ". . ? . .",
    )
    solution = solve(grid)
    assert solution.answers() == [3, 12]
    assert solution.answer_hops() == [1, 2]
    assert solution.equation_steps == [1, 2]


def test_equations_sharing_a_blank_share_a_step_and_deadlock_is_unsolved():
    # (0, 4) is the only unknown of both the across and the down equation: both are step 1.
    shared = grid_of(
        "2 + 3 = ?",
        ". . . . -",
        ". . . . 1",
        ". . . . =",
        ". . . . 4",
    )
    solution = solve(shared)
    assert solution.answer_hops() == [1]
    assert solution.equation_steps == [1, 1]
    assert solution.solving_steps() == {"step1": ["2+3=5", "5-1=4"]}

    stuck = grid_of("? + ? = 5")
    solution = solve(stuck)
    assert not solution.solved and solution.unsolved == [(0, 0), (0, 2)]
    with pytest.raises(ValueError, match="cannot be determined"):
        solution.answer_hops()


def test_chain_of_thought_walks_the_rounds_and_ends_in_the_answer():
    cot = chain_of_thought(CHAIN)
    assert extract_answer(cot) == ["5", "10", "6", "7"]
    assert cot.rstrip().endswith("<answer>5 10 6 7</answer>")
    assert cot.index("Step 1:") < cot.index("Step 2:") < cot.index("Step 3:") < cot.index("Step 4:")
    assert "10 - ? = 4" in cot and "10 - 4 = 6" in cot  # the equation as known, then the inverse operation
    with pytest.raises(ValueError):
        chain_of_thought(grid_of("? + ? = 5"))
