"""The generator: validity, determinability, difficulty labels, reproducibility."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tokenswap.crossmath import (
    classify_difficulty,
    find_equations,
    format_markdown_table,
    generate_puzzle,
    generate_puzzles,
    parse_markdown_table,
    solve,
)
from tokenswap.crossmath.grid import OPERATORS, apply_operator


def check_valid(puzzle) -> None:
    """Every invariant of SPECS §1.2 and §1.3, checked independently of the generator's own checks."""
    grid, full = puzzle.grid, puzzle.solution_grid
    lo, hi = puzzle.number_range
    rows, cols = len(grid), len(grid[0])
    assert rows % 2 == 1 and cols % 2 == 1
    for r in range(rows):
        for c in range(cols):
            cell = grid[r][c]
            if cell == "?" or cell.isdigit():
                assert r % 2 == 0 and c % 2 == 0, (r, c, cell)
                assert full[r][c].isdigit() and lo <= int(full[r][c]) <= hi
                if cell != "?":
                    assert full[r][c] == cell
            elif cell:
                assert cell in (*OPERATORS, "=") and (r % 2) + (c % 2) == 1, (r, c, cell)
    # Crossings share only number cells, and no cell is left outside an equation.
    equations = find_equations(full)
    covered = {cell for eq in equations for cell in eq.cells}
    assert covered == {(r, c) for r in range(rows) for c in range(cols) if full[r][c]}
    operator_cells = [cell for eq in equations for cell in (eq.cells[1], eq.cells[3])]
    assert len(operator_cells) == len(set(operator_cells))
    for eq in equations:
        a, b, c = (int(full[r][k]) for r, k in eq.numbers)
        assert apply_operator(a, eq.op, b) == c, eq
        assert eq.op in puzzle.operators
    # The hop solver determines every blank, to the true value.
    solution = solve(grid)
    assert solution.solved
    assert [str(v) for v in solution.answers()] == puzzle.answer
    assert len(puzzle.answer) >= 1


def check_difficulty(puzzle) -> None:
    hops = puzzle.hops
    n_eq = len(find_equations(puzzle.grid))
    if puzzle.difficulty == "easy":
        assert max(hops) == 1
    elif puzzle.difficulty == "medium":
        assert 2 <= max(hops) <= 5
    else:
        assert len(hops) == n_eq and max(hops) >= 3


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seed=st.integers(0, 2**32),
    difficulty=st.sampled_from(["easy", "medium", "hard"]),
    rows=st.sampled_from([9, 11]),
    cols=st.sampled_from([9, 11]),
    n_equations=st.integers(3, 6),
    hi=st.integers(20, 120),
    operators=st.sampled_from(["+-*/", "+-", "*/", "+*"]),
)
def test_every_generated_puzzle_is_valid_determinable_and_round_trips(
    seed, difficulty, rows, cols, n_equations, hi, operators
):
    puzzle = generate_puzzle(
        seed,
        difficulty=difficulty,
        rows=rows,
        cols=cols,
        n_equations=n_equations,
        number_range=(1, hi),
        operators=operators,
    )
    check_valid(puzzle)
    check_difficulty(puzzle)
    assert len(find_equations(puzzle.grid)) == n_equations
    assert len(puzzle.grid) <= rows and len(puzzle.grid[0]) <= cols
    assert parse_markdown_table(puzzle.markdown) == puzzle.grid
    assert format_markdown_table(parse_markdown_table(puzzle.markdown)) == puzzle.markdown


@pytest.mark.parametrize("difficulty", ["easy", "medium", "hard"])
def test_default_sized_puzzles_have_their_difficulty(difficulty):
    puzzles = [generate_puzzle(seed, difficulty=difficulty) for seed in range(15)]
    for puzzle in puzzles:
        check_valid(puzzle)
        check_difficulty(puzzle)
        assert 6 <= len(find_equations(puzzle.grid)) <= 12
    deepest = max(max(p.hops) for p in puzzles)
    if difficulty == "hard":
        assert deepest >= 5  # hard collections reach deep chains, not just the minimum of 3


def test_classify_difficulty_boundaries():
    assert classify_difficulty(9, 10, 1) == "easy"
    assert classify_difficulty(10, 10, 2) == "medium"
    assert classify_difficulty(9, 10, 5) == "medium"
    assert classify_difficulty(10, 10, 3) == "hard"
    assert classify_difficulty(4, 10, 6) == "hard"


def test_seeded_and_reproducible():
    assert generate_puzzle(11, difficulty="hard").to_record() == generate_puzzle(11, difficulty="hard").to_record()
    assert generate_puzzle(11).markdown != generate_puzzle(12).markdown
    full = generate_puzzles(5, seed=3)
    tail = generate_puzzles(2, seed=3, start=3)
    assert [p.to_record() for p in full[3:]] == [p.to_record() for p in tail]
    assert [p.difficulty for p in full] == ["easy", "medium", "hard", "easy", "medium"]
    assert [p.id for p in tail] == ["crossmath_3_000003", "crossmath_3_000004"]


def test_record_fields_agree_with_the_puzzle():
    puzzle = generate_puzzle(5, difficulty="medium", number_range=(2, 60), operators="+-*/")
    record = puzzle.to_record()
    assert record["markdown_table"] == puzzle.markdown
    assert record["problems"] == len(find_equations(puzzle.grid))
    assert record["range"] == [2, 60] and record["operators"] == "+-*/" and record["difficulty"] == "medium"
    assert [c.strip() for c in record["markdown_answer"].split("|") if c.strip()] == puzzle.answer
    steps = [c.strip() for c in record["markdown_answer_step"].split("|") if c.strip()]
    assert steps == [f"step{h}" for h in puzzle.hops]
    across, down = record["solutions"].split("\n\nDown\n")
    assert across.startswith("Across\n")
    assert len(across.split("\n")) - 1 + len(down.split("\n")) == record["problems"]
    assert sum(len(v) for v in record["solving_steps"].values()) >= 1
    assert max(int(k[4:]) for k in record["solving_steps"]) == max(puzzle.hops)


def test_invalid_arguments_name_the_field():
    with pytest.raises(ValueError, match="rows must be odd"):
        generate_puzzle(0, rows=8)
    with pytest.raises(ValueError, match="lo must be >= 1"):
        generate_puzzle(0, number_range=(0, 50))
    with pytest.raises(ValueError, match="difficulty must be one of"):
        generate_puzzle(0, difficulty="extreme")
    with pytest.raises(ValueError, match="n_equations must be >= 3"):
        generate_puzzle(0, difficulty="hard", n_equations=2)
    with pytest.raises(RuntimeError, match="larger rows/cols"):
        generate_puzzle(0, rows=5, cols=5, n_equations=7, difficulty="easy")
