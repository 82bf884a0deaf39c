"""Our own CrossMath puzzle generator, shaped like the released test set (docs/crossmath_fidelity.md).

A puzzle grows from one random equation: each new equation crosses an existing number cell at
a right angle, on the odd-sized lattice (numbers at even/even, operators where one index is
odd), so crossings share only number cells. Values are drawn in ``[lo, hi]`` so that every
equation holds exactly (exact division, no negatives). Blanks are then chosen by a small local
search for the structure the released puzzles have:

* every equation has 1 or 2 blanks (easy: exactly 1), and every equation has exactly one
  unknown in some solver round (none goes from >= 2 unknowns to 0 in one round), so every
  blank is solved through a one-unknown equation and ``solving_steps`` lists every equation;
* ``easy``: blanks = equations - k, k drawn from the released 1-6, so every blank is hop 1;
* ``medium``: blanks = equations - k, k in 1-3, deepest hop drawn from the released 1-5;
* ``hard``: as many blanks as equations, deepest hop drawn from the released 2-7.

The local search also aims at the released shares of two-blank equations and of blanks solved
in rounds 1 and 2. Defaults draw, per puzzle, 5-15 equations with the released frequencies (spread
evenly over a collection by :func:`generate_puzzles`) on a canvas of up to 17x21 cells, a number
range with low end 1-5 and high end 51-249, and operators at the released shares; every one of
these can be fixed for curriculum use (``n_equations``, ``number_range``, ``operators``,
``rows``/``cols``, ``max_hop``). Everything is drawn from ``random.Random(seed)``, so a seed always
gives the same puzzle.

One module although it is long (~840 lines): layout growth, value drawing and the blank search are
one calibrated process (their odds were fitted together against the release), so they stay side by side.
"""

from __future__ import annotations

import hashlib
import math
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
from tokenswap.crossmath.render import StyleName, image_names, puzzle_id_from_image
from tokenswap.crossmath.solver import HopSolution, solve

__all__ = [
    "DIFFICULTIES",
    "Difficulty",
    "Puzzle",
    "classify_difficulty",
    "generate_puzzle",
    "generate_puzzles",
    "mixed_difficulty",
    "puzzle_seed",
]

Difficulty = Literal["easy", "medium", "hard"]
DIFFICULTIES: tuple[Difficulty, ...] = ("easy", "medium", "hard")
_MAX_TRIES = 400


def classify_difficulty(n_blanks: int, n_equations: int, max_hop: int) -> Difficulty:
    """A structural difficulty label for a solvable puzzle.

    ``hard`` if there are as many blanks as equations (and some hop beyond 1); else ``easy`` if every
    blank is hop 1; else ``medium``. The released labels come from the source website, so they
    follow this except for 8 released ``medium`` puzzles whose blanks are all hop 1.

    >>> classify_difficulty(7, 10, 1), classify_difficulty(8, 10, 4), classify_difficulty(10, 10, 2)
    ('easy', 'medium', 'hard')
    """
    if n_blanks >= n_equations and max_hop >= 2:
        return "hard"
    if max_hop <= 1:
        return "easy"
    return "medium"


# Released per-difficulty shapes (250 puzzles, docs/crossmath_fidelity.md), as {value: puzzles}.
# "equations - blanks" is how many blanks sit on a crossing (easy) or are shared (medium).
_RELEASED_SHORTFALL: dict[str, dict[int, int]] = {
    "easy": {1: 7, 2: 19, 3: 18, 4: 22, 5: 20, 6: 4},
    "medium": {1: 33, 2: 36, 3: 16},
    "hard": {0: 75},
}
_RELEASED_EQUATIONS: dict[str, dict[int, int]] = {
    "easy": {5: 7, 6: 11, 7: 5, 8: 9, 9: 2, 10: 6, 11: 10, 12: 6, 13: 14, 14: 9, 15: 11},
    "medium": {5: 7, 6: 10, 7: 10, 8: 5, 9: 9, 10: 9, 11: 6, 12: 7, 13: 7, 14: 8, 15: 7},
    "hard": {5: 3, 6: 8, 7: 6, 8: 7, 9: 3, 10: 10, 11: 4, 12: 5, 13: 9, 14: 11, 15: 9},
}
_RELEASED_MAX_HOP: dict[str, dict[int, int]] = {
    "easy": {1: 90},
    "medium": {1: 8, 2: 38, 3: 34, 4: 2, 5: 3},
    "hard": {2: 2, 3: 30, 4: 12, 5: 23, 6: 4, 7: 4},
}
# Share of equations with two blanks (the rest have one): 0/941, 183/834, 413/798.
_RELEASED_DOUBLE_SHARE = {"easy": 0.0, "medium": 0.22, "hard": 0.52}
# Per-puzzle aims for the blanks solved in rounds 1 and 2. Released shares: round 1 941/941, 523/681,
# 385/798; round 2 0, 108/681, 189/798. The aims are calibrated so that 250 default puzzles land on the
# released shares (the search stops within a slack, and deep targets pull blanks out of rounds 1-2).
_RELEASED_FIRST_HOP_SHARE = {"easy": 1.0, "medium": 0.83, "hard": 0.52}
_RELEASED_SECOND_HOP_SHARE = {"easy": 0.0, "medium": 0.12, "hard": 0.19}
# Which number of an equation is blank (a / b / c), counted once per equation a blank sits in. Released: easy
# 310 / 299 / 332, medium 364 / 182 / 471, hard 429 / 301 / 481. The aims are calibrated so that default
# puzzles land on the released shares (some layouts cannot reach them).
_BLANK_POSITION_AIM: dict[str, tuple[float, float, float]] = {
    "easy": (0.33, 0.27, 0.40),
    "medium": (0.38, 0.03, 0.59),
    "hard": (0.355, 0.22, 0.425),
}
# Operator cells in the release, per difficulty (+ / - / × / ÷): easy 337 / 333 / 165 / 106, medium
# 343 / 269 / 133 / 89, hard 286 / 289 / 128 / 95. × and ÷ fit a range less often (exact division, products in
# range), so the try-first weights are calibrated until the placed operators come out at the released shares.
_OPERATOR_WEIGHTS: dict[str, dict[str, float]] = {
    "easy": {"+": 966, "-": 891, "×": 850, "÷": 540},
    "medium": {"+": 1100, "-": 850, "×": 800, "÷": 520},
    "hard": {"+": 900, "-": 1000, "×": 750, "÷": 540},
}
# Layout shape, calibrated so that default puzzles land on the released grid size, density, crossings and
# loops (tests/tokenswap/crossmath/test_generator.py checks them against the release within sampling error).
_INWARD_REFUSAL = 0.65
# Relative odds of a 1-, 2- and 3-digit value at each position of an equation where the generator has a
# choice. Uniform draws give too many 1-digit numbers (24% against the released 16.8%), mostly in + and -,
# and ÷ quotients as small as the divisors (the released quotients are mostly 2-digit, the divisors 1-digit).
_SUM_TERM = (0.08, 1.0, 0.75)
_DIGIT_WEIGHT: dict[str, tuple[tuple[float, float, float], ...]] = {
    "+": (_SUM_TERM,) * 3,
    "-": (_SUM_TERM, _SUM_TERM, (0.02, 1.0, 0.75)),
    "×": ((1.0, 1.0, 1.0), (1.0, 1.0, 1.0), (0.1, 1.0, 1.0)),
    "÷": ((0.1, 1.0, 1.0), (1.0, 1.0, 1.0), (0.1, 1.0, 1.0)),
}


def _digit_weight(op: str, values: list[int], positions) -> float:
    return math.prod(_DIGIT_WEIGHT[op][k][(values[k] >= 10) + (values[k] >= 100)] for k in positions)


_TALLER_REFUSAL = 0.1
_LOOP_SHARE = 0.5
DEFAULT_ROWS, DEFAULT_COLS = 17, 21
"""The largest released grid: default canvas, cropped to the used cells."""
DEFAULT_EQUATIONS = (5, 15)
"""Released equations per puzzle; drawn from the released counts of the difficulty."""
DEFAULT_LOW_END, DEFAULT_HIGH_END = (1, 5), (51, 249)
"""Released ``range``: low end drawn in 1-5, high end in 51-249."""


def _draw(rng: random.Random, table: dict[int, int]) -> int:
    values = list(table)
    return rng.choices(values, weights=[table[v] for v in values])[0]


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

    def to_record(self, style: StyleName = "original") -> dict:
        """The released CrossMath record of this puzzle in ``style``, byte for byte in the released layout.

        Same keys in the same order as the released JSONL (Beige adds ``img_noborder`` and
        ``img_blank_noborder``), ``solutions`` and ``solving_steps`` spelt ``23+10=33`` with every
        equation in them, image paths named as released so that the id (the file name without its
        style suffix) is the same in every style. ``json.dumps(record, ensure_ascii=False)`` is the line.
        """
        solution = self.solution
        full = solve(self.solution_grid)
        answer = dict(zip(self.blanks, self.answer))
        step = {cell: f"step{hop}" for cell, hop in zip(self.blanks, self.hops)}
        across = [eq.render(full.values, sep="") for eq in full.equations if eq.direction == "across"]
        down = [eq.render(full.values, sep="") for eq in full.equations if eq.direction == "down"]
        img, img_blank = image_names(self.id, style)
        record = {
            "img": img,
            "img_blank": img_blank,
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
        if style == "beige":
            record["img_noborder"] = f"images_noborder/{self.id}.png"
            record["img_blank_noborder"] = f"images_blank_noborder/{self.id}_blank.png"
        return record

    @classmethod
    def from_record(cls, record: dict) -> Puzzle:
        """Rebuild a puzzle from a released-format record (ours or the released data).

        The id is the record's ``id`` (the loader adds it) or else the one in ``img_blank``'s file name.

        Raises:
            KeyError: if ``markdown_table``, ``markdown_answer``, ``range``, ``difficulty`` or ``operators``
                is missing.
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
            id=str(record.get("id") or (puzzle_id_from_image(record["img_blank"]) if "img_blank" in record else "")),
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


def _trivial(op: str, values: list[int]) -> bool:
    # Multiplying or dividing by 1 gives the answer away; the release has it in 6 of its 716 × and ÷ equations.
    a, b, c = values
    return op in "×÷" and (b == 1 or (a == 1 if op == "×" else c == 1))


def _complete(op: str, fixed: list[int | None], lo: int, hi: int, rng: random.Random) -> list[int] | None:
    """Values ``[a, b, c]`` for ``a op b = c`` in ``[lo, hi]`` agreeing with the fixed ones, or None.

    Uniform over the equations that fit (the released values look drawn that way: ``+`` operands skew small,
    sums large), avoiding ``× 1`` and ``÷ 1`` unless nothing else fits.
    """
    free = [p for p in range(3) if fixed[p] is None]
    if not free:
        return list(fixed) if apply_operator(fixed[0], op, fixed[1]) == fixed[2] else None
    if len(free) == 1:
        value = solve_for(free[0], op, *fixed)
        if value is None or not lo <= value <= hi:
            return None
        out = list(fixed)
        out[free[0]] = value
        # A forced value is kept with its digit odds, so that forced and chosen values end up alike.
        return None if _trivial(op, out) or rng.random() >= _digit_weight(op, out, free) else out
    if len(free) == 3:
        # Rejection sampling of the two operands (× and +) or of divisor and quotient (÷) or subtrahend and
        # difference (-) is uniform over every equation that fits; 1s in × and ÷ are drawn again, and kept
        # only if nothing else turns up (a range such as 1-3 has no other product).
        fallback = None
        for _ in range(400):
            x, y = rng.randint(lo, hi), rng.randint(lo, hi)
            values = {
                "+": [x, y, x + y],
                "-": [x + y, x, y],
                "×": [x, y, x * y],
                "÷": [x * y, x, y],
            }[op]
            if values[0 if op in "-÷" else 2] > hi:
                continue
            if _trivial(op, values):
                fallback = fallback or values
            elif rng.random() < _digit_weight(op, values, range(3)):
                return values
        return fallback
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
        (boring if _trivial(op, trial) else options).append(trial)
    pool = options or boring
    if not pool:
        return None
    weights = [_digit_weight(op, t, (first, second)) for t in pool]
    return rng.choices(pool, weights=weights)[0]


def _operator_order(rng: random.Random, ops: str, difficulty: Difficulty) -> list[str]:
    """The operators to try, in a random order weighted by their released frequency."""
    left, order = list(ops), []
    while left:
        op = rng.choices(left, weights=[_OPERATOR_WEIGHTS[difficulty][o] for o in left])[0]
        order.append(op)
        left.remove(op)
    return order


def _layout(
    rng: random.Random,
    rows: int,
    cols: int,
    n_equations: int,
    lo: int,
    hi: int,
    ops: str,
    difficulty: Difficulty,
    loop: bool = False,
) -> tuple[dict[Cell, int], list[_Placed]] | None:
    """Grow ``n_equations`` crossing equations with valid values, or None if the canvas is too tight.

    The released puzzles are trees of equations with at most one loop, spread out (a third of the cropped
    grid filled) and with hubs (29% of equations cross others at all three numbers, 40% at one). So each new
    equation crosses one existing number cell of an equation drawn with weight ``(1 + its crossings)^2``;
    it may cross a second existing cell (closing the one loop) only if ``loop``; and a placement that does
    not grow the bounding box is refused with probability ``_INWARD_REFUSAL``.
    """
    numbers: dict[Cell, int] = {}
    directions: dict[Cell, set[str]] = {}
    lines: dict[tuple[str, int], list[int]] = {}
    placed: list[_Placed] = []
    loops = 0
    box = [rows, -1, cols, -1]  # top, bottom, left, right of the cells used so far
    owner: dict[Cell, int] = {}  # the equation that placed each number cell
    crossings: list[int] = []  # per equation, how many of its numbers another equation shares

    def extent(direction: str) -> tuple[int, int]:  # (lines, length along the line)
        return (rows, cols) if direction == "across" else (cols, rows)

    def try_place(direction: str, line: int, start: int) -> bool:
        nonlocal loops
        n_lines, length = extent(direction)
        if start < 0 or start + 4 >= length or line < 0 or line >= n_lines:
            return False
        # Same-line equations need an empty cell between them, else they read as one long run.
        if any(abs(start - other) < 6 for other in lines.get((direction, line), ())):
            return False
        cells = _cells(direction, line, start)
        nums = (cells[0], cells[2], cells[4])
        fixed = [numbers.get(cell) for cell in nums]
        closes = sum(v is not None for v in fixed) - 1 if placed else 0
        if closes > (1 - loops if loop else 0):
            return False
        (top, left), (bottom, right) = cells[0], cells[4]
        inward = box[0] <= top and bottom <= box[1] and box[2] <= left and right <= box[3]
        if inward and rng.random() < _INWARD_REFUSAL:
            return False
        if (top < box[0] or bottom > box[1]) and rng.random() < _TALLER_REFUSAL:
            return False
        for op in _operator_order(rng, ops, difficulty):
            values = _complete(op, fixed, lo, hi, rng)
            if values is None:
                continue
            crossings.append(0)
            for cell, value, known in zip(nums, values, fixed):
                numbers[cell] = value
                directions.setdefault(cell, set()).add(direction)
                if known is None:
                    owner[cell] = len(placed)
                else:
                    crossings[owner[cell]] += 1
                    crossings[-1] += 1
            lines.setdefault((direction, line), []).append(start)
            placed.append(_Placed(numbers=nums, op=op, direction=direction, line=line, start=start))
            loops += closes
            box[:] = [min(box[0], top), max(box[1], bottom), min(box[2], left), max(box[3], right)]
            return True
        return False

    first = rng.choice(("across", "down"))
    n_lines, length = extent(first)
    if not try_place(first, 2 * rng.randrange((n_lines + 1) // 2), 2 * rng.randrange((length - 3) // 2)):
        return None
    for _ in range(30 * n_equations):
        if len(placed) == n_equations:
            break
        weights = [(1 + n) ** 2 for n in crossings]
        cell = rng.choice(rng.choices(placed, weights=weights)[0].numbers)
        open_dirs = [d for d in ("across", "down") if d not in directions[cell]]
        if not open_dirs:
            continue
        direction = rng.choice(open_dirs)
        line, along = (cell[0], cell[1]) if direction == "across" else (cell[1], cell[0])
        try_place(direction, line, along - 2 * rng.randrange(3))
    return (numbers, placed) if len(placed) == n_equations else None


# ---------------------------------------------------------------------------------------------
# Blank selection (structural: hops depend only on which cells are known)


def _rounds(masks: list[int], blanks: int) -> tuple[list[int], int, int]:
    """Structural hop solver on bit masks (cell ``i`` is bit ``i``; an equation is the mask of its three cells).

    Returns ``(blanks solved per round, unsolved blanks mask, equations that never had one unknown)``.
    Values are unique whenever the numbers are >= 1, so which cells are known decides everything.
    """
    unknown = blanks
    per_round: list[int] = []
    stepped = 0
    while unknown:
        new = 0
        for i, mask in enumerate(masks):
            missing = mask & unknown
            if missing and not missing & (missing - 1):  # exactly one unknown
                new |= missing
                stepped |= 1 << i
        if not new:
            break
        per_round.append(new.bit_count())
        unknown &= ~new
    # An equation with a blank but never exactly one unknown lost its last two unknowns in one round.
    collapsed = sum(1 for i, mask in enumerate(masks) if not stepped >> i & 1 and mask & blanks)
    return per_round, unknown, collapsed


@dataclass(frozen=True)
class _Target:
    n_blanks: int
    max_hop: int
    per_equation: tuple[int, ...]  # allowed blanks per equation
    doubles: int  # equations with two blanks
    first_hop: int  # blanks solved in round 1
    second_hop: int | None  # blanks solved in round 2 (None: no aim)
    positions: tuple[float, float, float]  # aimed shares of blanks at a, b and c of their equations


_SOFT_SLACK = 4
"""How far the statistical aims (equations with two blanks, hop-1 and hop-2 blanks, blanks at a/b/c) may be
missed per puzzle, in blanks."""


def _penalty(masks: list[int], positions: list[tuple[int, int]], blanks: int, target: _Target) -> tuple[int, float]:
    """``(hard, soft)``: hard counts broken rules (must reach 0), soft how far the statistical aims are missed."""
    per_round, unknown, collapsed = _rounds(masks, blanks)
    per_eq = [(mask & blanks).bit_count() for mask in masks]
    zero, two, three = per_eq.count(0), per_eq.count(2), per_eq.count(3)
    shape = zero + three + (two + three if target.per_equation == (1,) else 0)
    hard = shape + unknown.bit_count() + collapsed + abs(blanks.bit_count() - target.n_blanks)
    hard += abs(len(per_round) - target.max_hop)
    soft = abs(two - target.doubles) + abs((per_round[0] if per_round else 0) - target.first_hop)
    if target.second_hop is not None:
        soft += abs((per_round[1] if len(per_round) > 1 else 0) - target.second_hop)
    # positions[k]: the cells at position k of one of their equations, and of both (counted twice).
    at = [(blanks & once).bit_count() + (blanks & twice).bit_count() for once, twice in positions]
    slots = sum(at)
    # Half the L1 distance: moving one blank from a to c fixes both counts at once.
    soft += sum(abs(n - share * slots) for n, share in zip(at, target.positions)) / 2
    return hard, soft


def _one_per_equation(
    rng: random.Random, equations: list[tuple[int, int, int]], n_cells: int, n_blanks: int
) -> list[int]:
    """A start for easy puzzles: one blank per equation, ``len(equations) - n_blanks`` of them on crossings.

    Crossing cells whose two equations are both still blank-free are taken first, then every equation
    left gets a cell of its own. The local search repairs whatever this greedy pass cannot reach.
    """
    owners: list[list[int]] = [[] for _ in range(n_cells)]
    for i, eq in enumerate(equations):
        for x in eq:
            owners[x].append(i)
    covered = [False] * len(equations)
    chosen: list[int] = []
    crossings = [x for x in range(n_cells) if len(owners[x]) == 2]
    rng.shuffle(crossings)
    for x in crossings:
        if len(chosen) == len(equations) - n_blanks:
            break
        if not any(covered[i] for i in owners[x]):
            chosen.append(x)
            for i in owners[x]:
                covered[i] = True
    for i, eq in enumerate(equations):
        if covered[i]:
            continue
        own = [x for x in eq if all(not covered[j] or j == i for j in owners[x]) and len(owners[x]) == 1]
        pick = rng.choice(own) if own else rng.choice(eq)
        chosen.append(pick)
        for j in owners[pick]:
            covered[j] = True
    return chosen


def _choose_blanks(
    rng: random.Random, equations: list[tuple[int, int, int]], n_cells: int, target: _Target, steps: int = 300
) -> set[int] | None:
    """Local search for a blank set with the target's shape and depth (None if none found in ``steps`` moves)."""
    masks = [(1 << a) | (1 << b) | (1 << c) for a, b, c in equations]
    positions = []
    for k in range(3):
        once = twice = 0
        for eq in equations:
            twice |= once & (1 << eq[k])
            once |= 1 << eq[k]
        positions.append((once, twice))
    cells = list(range(n_cells))
    blanks = 0
    start = _one_per_equation(rng, equations, n_cells, target.n_blanks) if target.per_equation == (1,) else None
    for x in start if start is not None else rng.sample(cells, min(target.n_blanks, n_cells)):
        blanks |= 1 << x
    hard, soft = _penalty(masks, positions, blanks, target)
    if start is not None and all((mask & blanks).bit_count() == 1 for mask in masks):
        # One blank per equation already; on dense layouts no other blank count is possible.
        if abs(len(start) - target.n_blanks) <= 1 and soft <= _SOFT_SLACK:
            return set(start)
    for _ in range(steps):
        if hard == 0 and soft <= _SOFT_SLACK:
            break
        inside = [x for x in cells if blanks >> x & 1]
        outside = [x for x in cells if not blanks >> x & 1]
        trial = blanks
        if (rng.random() < 0.7 or len(inside) == target.n_blanks) and inside and outside:
            trial ^= (1 << rng.choice(inside)) | (1 << rng.choice(outside))
        elif len(inside) < target.n_blanks and outside:
            trial |= 1 << rng.choice(outside)
        elif inside:
            trial &= ~(1 << rng.choice(inside))
        new_hard, new_soft = _penalty(masks, positions, trial, target)
        # Sideways moves keep the search moving on plateaus; rare uphill moves get it out of dead ends.
        if 4 * new_hard + new_soft <= 4 * hard + soft or rng.random() < 0.02:
            blanks, hard, soft = trial, new_hard, new_soft
    if hard or soft > _SOFT_SLACK:
        return None
    return {x for x in cells if blanks >> x & 1}


def _crop(grid: list[list[str]]) -> list[list[str]]:
    used_rows = [r for r, row in enumerate(grid) if any(row)]
    used_cols = [c for c in range(len(grid[0])) if any(row[c] for row in grid)]
    return [row[used_cols[0] : used_cols[-1] + 1] for row in grid[used_rows[0] : used_rows[-1] + 1]]


def _validate_args(
    difficulty: str,
    rows: int,
    cols: int,
    n_equations: int | None,
    number_range: tuple[int, int] | None,
    max_hop: int | None,
) -> None:
    errors = []
    if difficulty not in DIFFICULTIES:
        errors.append(f"difficulty must be one of {DIFFICULTIES}, got {difficulty!r}")
    for name, value in (("rows", rows), ("cols", cols)):
        if value < 5 or value % 2 == 0:
            errors.append(f"{name} must be odd and >= 5 (equations are 5 cells on an odd lattice), got {value}")
    if number_range is not None:
        lo, hi = number_range
        if lo < 1:
            errors.append(f"number_range lo must be >= 1 (0 makes × and ÷ blanks ambiguous), got {lo}")
        if hi <= lo + 1:
            errors.append(f"number_range must have hi > lo + 1, got ({lo}, {hi})")
    min_eq = {"easy": 1, "medium": 2, "hard": 2}.get(difficulty, 1)
    if n_equations is not None and n_equations < min_eq:
        errors.append(f"n_equations must be >= {min_eq} for {difficulty!r} puzzles, got {n_equations}")
    if max_hop is not None:
        lowest = {"easy": 1, "medium": 1, "hard": 2}.get(difficulty, 1)
        if max_hop < lowest or (difficulty == "easy" and max_hop != 1):
            errors.append(
                f"max_hop must be {'1' if difficulty == 'easy' else f'>= {lowest}'} for {difficulty!r} puzzles, "
                f"got {max_hop}"
            )
        elif n_equations is not None and max_hop > n_equations:
            errors.append(f"max_hop {max_hop} needs at least as many equations, got n_equations={n_equations}")
    if errors:
        raise ValueError("; ".join(errors))


def _target(rng: random.Random, difficulty: Difficulty, n_eq: int, max_hop: int | None) -> _Target:
    shortfall = min(_draw(rng, _RELEASED_SHORTFALL[difficulty]), n_eq // 2)
    n_blanks = n_eq - shortfall
    depth = max_hop if max_hop is not None else _draw(rng, _RELEASED_MAX_HOP[difficulty])
    # Aims, not draws: a random aim is often unreachable on a given layout, and the slack adds the spread.
    doubles = round(n_eq * _RELEASED_DOUBLE_SHARE[difficulty])
    depth = min(depth, n_blanks)
    first = round(n_blanks * _RELEASED_FIRST_HOP_SHARE[difficulty])
    second = round(n_blanks * _RELEASED_SECOND_HOP_SHARE[difficulty])
    if depth == 1:
        first, second = n_blanks, 0
    elif depth > max(_RELEASED_MAX_HOP[difficulty], default=1):
        # Deeper than released (a curriculum): only the hop-1 aim, with room for a long chain.
        first, second = max(1, min(first, n_blanks - depth + 1)), None
    else:
        # Every round up to the deepest solves at least one blank: keep the aims reachable.
        room = n_blanks - (depth - 2)
        second = max(1, min(second, room - 1))
        first = max(1, min(first, room - second))
    return _Target(
        n_blanks=n_blanks,
        max_hop=depth,
        per_equation=(1,) if difficulty == "easy" else (1, 2),
        doubles=doubles,
        first_hop=first,
        second_hop=second,
        positions=_BLANK_POSITION_AIM[difficulty],
    )


def generate_puzzle(
    seed: int,
    difficulty: Difficulty = "medium",
    rows: int = DEFAULT_ROWS,
    cols: int = DEFAULT_COLS,
    n_equations: int | None = None,
    number_range: tuple[int, int] | None = None,
    operators: str = "+-*/",
    puzzle_id: str | None = None,
    max_hop: int | None = None,
) -> Puzzle:
    """Generate one valid puzzle of the requested difficulty.

    Args:
        seed: the only source of randomness; the same arguments give the same puzzle.
        difficulty: ``easy``, ``medium`` or ``hard`` (see the module docstring).
        rows: canvas height (odd, >= 5); the puzzle is cropped to its used cells.
        cols: canvas width (odd, >= 5).
        n_equations: number of equations; ``None`` draws one in 5-15 with the released frequencies.
        number_range: ``(lo, hi)``, ``lo >= 1``; every operand and result lies in it. ``None`` draws
            ``lo`` in 1-5 and ``hi`` in 51-249 per puzzle, as released.
        operators: the operator set, e.g. ``"+-*/"`` or ``"+-"`` (``× ÷ x`` also accepted).
        puzzle_id: the puzzle's ``id``; defaults to ``crossmath_<seed>``.
        max_hop: the deepest hop (easy: 1; hard: >= 2); ``None`` draws it from the released
            distribution of the difficulty. Larger values give deeper chains for a curriculum.

    Returns:
        A :class:`Puzzle` whose every equation holds and whose every blank the hop solver determines.

    Raises:
        ValueError: on invalid arguments (the message names the argument and the fix).
        RuntimeError: if no puzzle fits after many tries (the canvas is too small for ``n_equations``).
    """
    _validate_args(difficulty, rows, cols, n_equations, number_range, max_hop)
    ops = normalize_operators(operators)
    rng = random.Random(seed)
    # Drawn once, so that puzzles that are harder to build are not under-represented.
    n_eq = n_equations if n_equations is not None else _draw(rng, _RELEASED_EQUATIONS[difficulty])
    lo, hi = (
        number_range if number_range is not None else (rng.randint(*DEFAULT_LOW_END), rng.randint(*DEFAULT_HIGH_END))
    )
    for attempt in range(_MAX_TRIES):
        # A target is kept over several layouts (redrawing it at every failure would favour the easy
        # shapes), but redrawn now and then: some shapes cannot be built on some equation counts.
        if attempt % 5 == 0:
            target = _target(rng, difficulty, n_eq, max_hop)
        layout = _layout(rng, rows, cols, n_eq, lo, hi, ops, difficulty, loop=rng.random() < _LOOP_SHARE)
        if layout is None:
            continue
        numbers, placed = layout
        index = {cell: i for i, cell in enumerate(numbers)}
        equations = [tuple(index[cell] for cell in eq.numbers) for eq in placed]
        blanks = _choose_blanks(rng, equations, len(numbers), target)
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
        # The structural search promised these; the real solver on the real numbers must agree.
        if not solution.solved or [str(v) for v in solution.answers()] != puzzle.answer:
            continue
        if any(step is None for step in solution.equation_steps):
            continue
        return puzzle
    raise RuntimeError(
        f"no {difficulty} puzzle with {n_equations} equations fits a {rows}x{cols} canvas after {_MAX_TRIES} "
        f"tries (seed {seed}); use a larger rows/cols or fewer n_equations"
    )


def _mixed_pattern(counts: tuple[int, ...]) -> tuple[Difficulty, ...]:
    # Each slot goes to the difficulty furthest behind its share, so any run of indices is well mixed.
    total, taken, pattern = sum(counts), [0] * len(counts), []
    for i in range(total):
        k = max(range(len(counts)), key=lambda d: (counts[d] * (i + 1) / total - taken[d], -d))
        taken[k] += 1
        pattern.append(DIFFICULTIES[k])
    return tuple(pattern)


_MIXED = _mixed_pattern((18, 17, 15))  # the released 90 : 85 : 75, per 50 puzzles


def mixed_difficulty(index: int) -> Difficulty:
    """The difficulty of puzzle ``index`` of a ``"mixed"`` collection: every 50 puzzles hold 18 easy, 17 medium, 15 hard.

    >>> [mixed_difficulty(i) for i in range(6)]
    ['easy', 'medium', 'hard', 'easy', 'medium', 'hard']
    """
    return _MIXED[index % len(_MIXED)]


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
        difficulty: one difficulty for all, or ``"mixed"``: the released 90 : 85 : 75 mix of easy,
            medium and hard, interleaved by index (:func:`mixed_difficulty`).
        start: index of the first puzzle (to continue a collection).
        **kwargs: passed on to :func:`generate_puzzle` (``rows``, ``cols``, ``n_equations``, ...). Without
            ``n_equations``, counts are spread evenly over the released distribution of each difficulty.

    Returns:
        The puzzles, with ids ``crossmath_<seed>_<index:06d>``.
    """
    puzzles = []
    for i in range(start, start + n):
        level = mixed_difficulty(i) if difficulty == "mixed" else difficulty
        args = dict(kwargs)
        if args.get("n_equations") is None:
            # Equation counts spread evenly over the released distribution, so that even a small collection
            # has the released mean (independent draws stray by ~0.35 equations per 90 puzzles).
            rank = _rank_in_difficulty(i) if difficulty == "mixed" else i
            args["n_equations"] = _spread_equations(seed, level, rank)
        puzzles.append(
            generate_puzzle(puzzle_seed(seed, i), difficulty=level, puzzle_id=f"crossmath_{seed}_{i:06d}", **args)
        )
    return puzzles


def _rank_in_difficulty(index: int) -> int:
    """How many puzzles of the same difficulty come before ``index`` in a mixed collection."""
    level = mixed_difficulty(index)
    cycle, offset = divmod(index, len(_MIXED))
    return cycle * _MIXED.count(level) + _MIXED[:offset].count(level)


def _spread_equations(seed: int, difficulty: Difficulty, rank: int) -> int:
    """The equation count of the ``rank``-th puzzle of a difficulty: a golden-ratio sequence through the released CDF."""
    table = _RELEASED_EQUATIONS[difficulty]
    u = (rank * 0.6180339887498949 + puzzle_seed(seed, -1) / 2**64) % 1.0
    total, acc = sum(table.values()), 0
    for value, count in table.items():
        acc += count
        if u < acc / total:
            return value
    return max(table)
