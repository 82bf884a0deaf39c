"""Our own CrossMath puzzle generator (the released puzzles are non-commercial; none are used here).

A puzzle grows from one random equation: each new equation crosses an existing number cell at
a right angle, on the odd-sized lattice (numbers at even/even, operators where one index is
odd), so crossings share only number cells. Values are drawn in ``[lo, hi]`` so that every
equation holds exactly (exact division, no negatives). Blanks are then chosen to hit the
requested difficulty, and a puzzle is accepted only if the hop solver determines every blank
to its true value:

* ``easy``: every blank is solved in hop 1;
* ``medium``: fewer blanks than equations, max hop in ``[2, 5]``;
* ``hard``: as many blanks as equations (one per equation), max hop at least 3.

Everything is drawn from ``random.Random(seed)``, so a seed always gives the same puzzle.
"""

from __future__ import annotations

import hashlib
import random
from dataclasses import dataclass, field
from typing import Literal

from tokenswap.crossmath.grid import (
    BLANK,
    Cell,
    apply_operator,
    format_markdown_table,
    normalize_operators,
    operators_ascii,
    parse_markdown_table,
    solve_for,
)
from tokenswap.crossmath.solver import HopSolution, solve

__all__ = [
    "DIFFICULTIES",
    "Difficulty",
    "Puzzle",
    "classify_difficulty",
    "generate_puzzle",
    "generate_puzzles",
    "puzzle_seed",
]

Difficulty = Literal["easy", "medium", "hard"]
DIFFICULTIES: tuple[Difficulty, ...] = ("easy", "medium", "hard")
_MAX_TRIES = 400


def classify_difficulty(n_blanks: int, n_equations: int, max_hop: int) -> Difficulty:
    """The difficulty label of a solvable puzzle.

    ``easy`` if every blank is hop 1; ``hard`` if there are as many blanks as equations and the
    deepest hop is at least 3, or the deepest hop exceeds 5; ``medium`` otherwise.

    >>> classify_difficulty(7, 10, 1), classify_difficulty(8, 10, 4), classify_difficulty(10, 10, 6)
    ('easy', 'medium', 'hard')
    """
    if max_hop <= 1:
        return "easy"
    if max_hop > 5 or (n_blanks >= n_equations and max_hop >= 3):
        return "hard"
    return "medium"


@dataclass
class Puzzle:
    """A solved CrossMath puzzle.

    Attributes:
        grid: the puzzle as shown, ``?`` at blanks.
        solution_grid: the same grid with every blank filled.
        difficulty: ``easy``, ``medium`` or ``hard``.
        number_range: ``(lo, hi)``: every number in the grid lies in it.
        operators: the operator set it was drawn from, canonical glyphs (e.g. ``"+-×÷"``).
        id: a stable identifier (used for file names and resuming).
        seed: the seed that generated it, or ``None`` for a puzzle read from a record.
    """

    grid: list[list[str]]
    solution_grid: list[list[str]]
    difficulty: Difficulty
    number_range: tuple[int, int]
    operators: str
    id: str
    seed: int | None = None
    _solution: HopSolution | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def solution(self) -> HopSolution:
        """The hop solver's result on ``grid`` (computed once)."""
        if self._solution is None:
            self._solution = solve(self.grid)
        return self._solution

    @property
    def rows(self) -> int:
        return len(self.grid)

    @property
    def cols(self) -> int:
        return len(self.grid[0])

    @property
    def blanks(self) -> list[Cell]:
        """Blank cells in answer order."""
        return self.solution.blanks

    @property
    def answer(self) -> list[str]:
        """The gold answer tokens in answer order (as strings, as they are compared)."""
        return [self.solution_grid[r][c] for r, c in self.blanks]

    @property
    def hops(self) -> list[int]:
        """The hop of each blank in answer order."""
        return self.solution.answer_hops()

    @property
    def markdown(self) -> str:
        """The text format of the puzzle."""
        return format_markdown_table(self.grid)

    def _answer_table(self, fill: dict[Cell, str]) -> str:
        return format_markdown_table([[fill.get((r, c), "") for c in range(self.cols)] for r in range(self.rows)])

    def to_record(self) -> dict:
        """The released CrossMath record format (plus ``id`` and ``seed``).

        Image paths are relative to the style folder: ``images/<id>_blank.png`` (puzzle) and
        ``images/<id>.png`` (solved).
        """
        solution = self.solution
        full = solve(self.solution_grid)
        answer = dict(zip(self.blanks, self.answer))
        step = {cell: f"step{hop}" for cell, hop in zip(self.blanks, self.hops)}
        across = [eq.render(full.values) for eq in full.equations if eq.direction == "across"]
        down = [eq.render(full.values) for eq in full.equations if eq.direction == "down"]
        return {
            "id": self.id,
            "seed": self.seed,
            "img": f"images/{self.id}.png",
            "img_blank": f"images/{self.id}_blank.png",
            "problems": len(solution.equations),
            "operators": operators_ascii(self.operators),
            "difficulty": self.difficulty,
            "range": list(self.number_range),
            "markdown_table": self.markdown,
            "markdown_answer": self._answer_table(answer),
            "markdown_answer_step": self._answer_table(step),
            "solutions": "Across\n" + "\n".join(across) + "\n\nDown\n" + "\n".join(down),
            "solving_steps": solution.solving_steps(),
        }

    @classmethod
    def from_record(cls, record: dict) -> Puzzle:
        """Rebuild a puzzle from a released-format record (ours or the released data).

        Raises:
            KeyError: if ``markdown_table``, ``markdown_answer``, ``range``, ``difficulty`` or ``operators``
                is missing (``id`` and ``seed`` are optional: the released data has neither).
            ValueError: if the answer table's shape differs from the puzzle's.
        """
        grid = parse_markdown_table(record["markdown_table"])
        answer = parse_markdown_table(record["markdown_answer"])
        if len(answer) != len(grid) or len(answer[0]) != len(grid[0]):
            raise ValueError(
                f"markdown_answer is {len(answer)}x{len(answer[0])} but markdown_table is "
                f"{len(grid)}x{len(grid[0])}; the two tables must have the same shape"
            )
        solution_grid = [
            [answer[r][c] if cell == BLANK else cell for c, cell in enumerate(row)] for r, row in enumerate(grid)
        ]
        lo, hi = record["range"]
        return cls(
            grid=grid,
            solution_grid=solution_grid,
            difficulty=record["difficulty"],
            number_range=(int(lo), int(hi)),
            operators=normalize_operators(record["operators"]),
            id=str(record.get("id", "")),
            seed=record.get("seed"),
        )


def puzzle_seed(seed: int, index: int) -> int:
    """The seed of puzzle ``index`` in a collection generated with ``seed`` (stable across processes)."""
    digest = hashlib.blake2b(f"crossmath:{seed}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


# ---------------------------------------------------------------------------------------------
# Layout and values


@dataclass
class _Placed:
    numbers: tuple[Cell, Cell, Cell]
    op: str
    direction: str
    line: int
    start: int


def _cells(direction: str, line: int, start: int) -> list[Cell]:
    return [(line, start + i) if direction == "across" else (start + i, line) for i in range(5)]


def _complete(op: str, fixed: list[int | None], lo: int, hi: int, rng: random.Random) -> list[int] | None:
    """Values ``[a, b, c]`` for ``a op b = c`` in ``[lo, hi]`` agreeing with the fixed ones, or None."""
    free = [p for p in range(3) if fixed[p] is None]
    if not free:
        return list(fixed) if apply_operator(fixed[0], op, fixed[1]) == fixed[2] else None
    if len(free) == 1:
        value = solve_for(free[0], op, *fixed)
        if value is None or not lo <= value <= hi:
            return None
        out = list(fixed)
        out[free[0]] = value
        return out
    if len(free) == 3:
        fixed = list(fixed)
        fixed[rng.choice(free)] = rng.randint(lo, hi)
        return _complete(op, fixed, lo, hi, rng)
    # Two free cells: enumerate one, solve the other, pick among all consistent triples.
    first, second = rng.sample(free, 2)
    options, boring = [], []
    for value in range(lo, hi + 1):
        trial = list(fixed)
        trial[first] = value
        other = solve_for(second, op, *trial)
        if other is None or not lo <= other <= hi:
            continue
        trial[second] = other
        # Multiplying or dividing by 1 gives the answer away; keep such equations only as a fallback.
        (boring if op in "×÷" and (trial[1] == 1 or trial[2] == trial[0]) else options).append(trial)
    pool = options or boring
    return rng.choice(pool) if pool else None


def _layout(
    rng: random.Random, rows: int, cols: int, n_equations: int, lo: int, hi: int, ops: str
) -> tuple[dict[Cell, int], list[_Placed]] | None:
    """Grow ``n_equations`` crossing equations with valid values, or None if the canvas is too tight."""
    numbers: dict[Cell, int] = {}
    directions: dict[Cell, set[str]] = {}
    lines: dict[tuple[str, int], list[int]] = {}
    placed: list[_Placed] = []

    def extent(direction: str) -> tuple[int, int]:  # (lines, length along the line)
        return (rows, cols) if direction == "across" else (cols, rows)

    def try_place(direction: str, line: int, start: int) -> bool:
        n_lines, length = extent(direction)
        if start < 0 or start + 4 >= length or line < 0 or line >= n_lines:
            return False
        # Same-line equations need an empty cell between them, else they read as one long run.
        if any(abs(start - other) < 6 for other in lines.get((direction, line), ())):
            return False
        cells = _cells(direction, line, start)
        nums = (cells[0], cells[2], cells[4])
        fixed = [numbers.get(cell) for cell in nums]
        for op in rng.sample(ops, len(ops)):
            values = _complete(op, fixed, lo, hi, rng)
            if values is None:
                continue
            for cell, value in zip(nums, values):
                numbers[cell] = value
                directions.setdefault(cell, set()).add(direction)
            lines.setdefault((direction, line), []).append(start)
            placed.append(_Placed(numbers=nums, op=op, direction=direction, line=line, start=start))
            return True
        return False

    first = rng.choice(("across", "down"))
    n_lines, length = extent(first)
    if not try_place(first, 2 * rng.randrange((n_lines + 1) // 2), 2 * rng.randrange((length - 3) // 2)):
        return None
    for _ in range(30 * n_equations):
        if len(placed) == n_equations:
            break
        cell = rng.choice(list(numbers))
        open_dirs = [d for d in ("across", "down") if d not in directions[cell]]
        if not open_dirs:
            continue
        direction = rng.choice(open_dirs)
        line, along = (cell[0], cell[1]) if direction == "across" else (cell[1], cell[0])
        try_place(direction, line, along - 2 * rng.randrange(3))
    return (numbers, placed) if len(placed) == n_equations else None


# ---------------------------------------------------------------------------------------------
# Blank selection (structural: hops depend only on which cells are known)


def _hops(equations: list[tuple[int, int, int]], blanks: set[int]) -> dict[int, int] | None:
    unknown = set(blanks)
    hops: dict[int, int] = {}
    k = 0
    while unknown:
        k += 1
        new = set()
        for eq in equations:
            missing = [x for x in eq if x in unknown]
            if len(missing) == 1:
                new.add(missing[0])
        if not new:
            return None
        for x in new:
            hops[x] = k
        unknown -= new
    return hops


def _choose_blanks(
    rng: random.Random, equations: list[tuple[int, int, int]], n_cells: int, difficulty: Difficulty
) -> set[int] | None:
    n_eq = len(equations)
    if difficulty == "easy":
        target = rng.randint(max(1, (n_eq + 1) // 2), n_eq)
    elif difficulty == "medium":
        target = rng.randint(min(max(2, (3 * n_eq + 4) // 5), n_eq), max(2, n_eq - 1))
    else:
        target = n_eq
    blanks: set[int] = set()
    while len(blanks) < target:
        # Hard always deepens the chain; medium does half the time; otherwise any valid blank will do.
        deepen = difficulty == "hard" or (difficulty == "medium" and rng.random() < 0.5)
        scored = []
        for x in rng.sample(range(n_cells), n_cells):
            if x in blanks:
                continue
            hops = _hops(equations, blanks | {x})
            if hops is None:
                continue
            deepest = max(hops.values())
            if (difficulty == "easy" and deepest > 1) or (difficulty == "medium" and deepest > 5):
                continue
            scored.append((deepest, sum(hops.values()), x))
            if not deepen:
                break  # candidates are visited in random order, so the first valid one is a random pick
        if not scored:
            break
        scored.sort(key=lambda item: item[:2], reverse=True)
        blanks.add(rng.choice(scored[: max(1, min(3, len(scored) // 4))])[2])
    return blanks if blanks else None


def _crop(grid: list[list[str]]) -> list[list[str]]:
    used_rows = [r for r, row in enumerate(grid) if any(row)]
    used_cols = [c for c in range(len(grid[0])) if any(row[c] for row in grid)]
    return [row[used_cols[0] : used_cols[-1] + 1] for row in grid[used_rows[0] : used_rows[-1] + 1]]


def _validate_args(difficulty: str, rows: int, cols: int, n_equations: int | None, lo: int, hi: int) -> None:
    errors = []
    if difficulty not in DIFFICULTIES:
        errors.append(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    for name, value in (("rows", rows), ("cols", cols)):
        if value < 5 or value % 2 == 0:
            errors.append(f"{name} must be odd and >= 5 (equations are 5 cells on an odd lattice), got {value}")
    if lo < 1:
        errors.append(f"number_range lo must be >= 1 (0 makes × and ÷ blanks ambiguous), got {lo}")
    if hi <= lo + 1:
        errors.append(f"number_range must have hi > lo + 1, got ({lo}, {hi})")
    min_eq = {"easy": 1, "medium": 2, "hard": 3}.get(difficulty, 1)
    if n_equations is not None and n_equations < min_eq:
        errors.append(f"n_equations must be >= {min_eq} for {difficulty!r} puzzles, got {n_equations}")
    if errors:
        raise ValueError("; ".join(errors))


def generate_puzzle(
    seed: int,
    difficulty: Difficulty = "medium",
    rows: int = 13,
    cols: int = 13,
    n_equations: int | None = None,
    number_range: tuple[int, int] = (1, 100),
    operators: str = "+-*/",
    puzzle_id: str | None = None,
) -> Puzzle:
    """Generate one valid puzzle of the requested difficulty.

    Args:
        seed: the only source of randomness; the same arguments give the same puzzle.
        difficulty: ``easy``, ``medium`` or ``hard`` (see the module docstring).
        rows: canvas height (odd, >= 5); the puzzle is cropped to its used cells.
        cols: canvas width (odd, >= 5).
        n_equations: number of equations; ``None`` draws one in ``[6, 12]``.
        number_range: ``(lo, hi)``, ``lo >= 1``; every operand and result lies in it.
        operators: the operator set, e.g. ``"+-*/"`` or ``"+-"`` (``× ÷ x`` also accepted).
        puzzle_id: the puzzle's ``id``; defaults to ``crossmath_<seed>``.

    Returns:
        A :class:`Puzzle` whose every equation holds and whose every blank the hop solver determines.

    Raises:
        ValueError: on invalid arguments (the message names the argument and the fix).
        RuntimeError: if no puzzle fits after many tries (the canvas is too small for ``n_equations``).
    """
    lo, hi = number_range
    _validate_args(difficulty, rows, cols, n_equations, lo, hi)
    ops = normalize_operators(operators)
    rng = random.Random(seed)
    for _ in range(_MAX_TRIES):
        n_eq = n_equations if n_equations is not None else rng.randint(6, 12)
        layout = _layout(rng, rows, cols, n_eq, lo, hi, ops)
        if layout is None:
            continue
        numbers, placed = layout
        index = {cell: i for i, cell in enumerate(numbers)}
        equations = [tuple(index[cell] for cell in eq.numbers) for eq in placed]
        blanks = _choose_blanks(rng, equations, len(numbers), difficulty)
        if blanks is None:
            continue
        cells = list(numbers)
        full = [[""] * cols for _ in range(rows)]
        for eq in placed:
            all_cells = _cells(eq.direction, eq.line, eq.start)
            for cell, content in zip(all_cells, (None, eq.op, None, "=", None)):
                full[cell[0]][cell[1]] = str(numbers[cell]) if content is None else content
        grid = [row[:] for row in full]
        for x in blanks:
            r, c = cells[x]
            grid[r][c] = BLANK
        grid, full = _crop(grid), _crop(full)
        puzzle = Puzzle(
            grid=grid,
            solution_grid=full,
            difficulty=difficulty,
            number_range=(lo, hi),
            operators=ops,
            id=puzzle_id or f"crossmath_{seed}",
            seed=seed,
        )
        solution = puzzle.solution
        if not solution.solved or [str(v) for v in solution.answers()] != puzzle.answer:
            continue
        if classify_difficulty(len(blanks), len(placed), solution.max_hop) != difficulty:
            continue
        return puzzle
    raise RuntimeError(
        f"no {difficulty} puzzle with {n_equations} equations fits a {rows}x{cols} canvas after {_MAX_TRIES} "
        f"tries (seed {seed}); use a larger rows/cols or fewer n_equations"
    )


def generate_puzzles(
    n: int,
    seed: int,
    difficulty: Difficulty | Literal["mixed"] = "mixed",
    start: int = 0,
    **kwargs,
) -> list[Puzzle]:
    """Generate ``n`` puzzles; puzzle ``i`` depends only on ``(seed, i)``, so any slice can be regenerated.

    Args:
        n: number of puzzles.
        seed: collection seed; puzzle ``i`` uses :func:`puzzle_seed` ``(seed, i)``.
        difficulty: one difficulty for all, or ``"mixed"`` to cycle easy, medium, hard by index.
        start: index of the first puzzle (to continue a collection).
        **kwargs: passed on to :func:`generate_puzzle` (``rows``, ``cols``, ``n_equations``, ...).

    Returns:
        The puzzles, with ids ``crossmath_<seed>_<index:06d>``.
    """
    return [
        generate_puzzle(
            puzzle_seed(seed, i),
            difficulty=DIFFICULTIES[i % 3] if difficulty == "mixed" else difficulty,
            puzzle_id=f"crossmath_{seed}_{i:06d}",
            **kwargs,
        )
        for i in range(start, start + n)
    ]
