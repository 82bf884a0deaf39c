"""The hop solver: synchronized iterative deduction (SPECS §1.5).

Round ``k`` solves every equation that has exactly one unknown *as judged at the start of the
round*; all of the round's solutions are added to the known set together, after the sweep.
A blank's hop is the round that solved it; an equation's step is the first round in which it
had exactly one unknown. This reproduces the released ``markdown_answer_step`` for every blank.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tokenswap.crossmath.grid import BLANK, Cell, Equation, blank_cells, find_equations, solve_for

__all__ = ["HopSolution", "chain_of_thought", "solve"]


@dataclass
class HopSolution:
    """What the hop solver deduced about one grid.

    Attributes:
        equations: every equation of the grid, across then down.
        values: every number cell's value; given ones as written, deduced ones as computed
            (``None`` where the arithmetic has no unique non-negative integer answer).
        hops: the round that solved each blank it could solve.
        equation_steps: per equation, the first round in which it had exactly one unknown;
            ``None`` if it never had (it had no blank, or its blanks were solved elsewhere).
        derivations: per round, ``(equation index, cell)`` for each blank solved in it, the
            first equation (in grid order) that solved it.
        blanks: all blanks in answer order (rows top to bottom, cells left to right).
    """

    equations: list[Equation]
    values: dict[Cell, int | None]
    hops: dict[Cell, int]
    equation_steps: list[int | None]
    derivations: list[list[tuple[int, Cell]]] = field(default_factory=list)
    blanks: list[Cell] = field(default_factory=list)

    @property
    def unsolved(self) -> list[Cell]:
        """Blanks no round could determine (an invalid puzzle has some)."""
        return [cell for cell in self.blanks if cell not in self.hops]

    @property
    def solved(self) -> bool:
        """True if every blank got a hop and a value."""
        return not self.unsolved and all(self.values[cell] is not None for cell in self.blanks)

    @property
    def max_hop(self) -> int:
        """The deepest hop (0 for a grid with no blanks)."""
        return max(self.hops.values(), default=0)

    def answer_hops(self) -> list[int]:
        """Hops in answer order.

        Raises:
            ValueError: if some blank is unsolved.
        """
        if self.unsolved:
            raise ValueError(f"blanks {self.unsolved} cannot be determined by the hop solver")
        return [self.hops[cell] for cell in self.blanks]

    def answers(self) -> list[int]:
        """Values of the blanks in answer order.

        Raises:
            ValueError: if some blank is unsolved or has no integer value.
        """
        if not self.solved:
            raise ValueError(f"blanks {[c for c in self.blanks if self.values.get(c) is None]} have no solved value")
        return [self.values[cell] for cell in self.blanks]

    def solving_steps(self) -> dict[str, list[str]]:
        """``{"step1": ["12+5=17", ...], ...}``: completed equations grouped by their step, in the released spelling.

        Within a step, across equations come first, then down ones, each in row-major order of their
        first cell. An equation that never had exactly one unknown (no blank, or its last two unknowns
        were solved elsewhere in one round) has no step and is left out; generated puzzles have none.
        """
        steps: dict[str, list[str]] = {}
        for equation, step in zip(self.equations, self.equation_steps):
            if step is not None:
                steps.setdefault(f"step{step}", []).append(equation.render(self.values, sep=""))
        return dict(sorted(steps.items(), key=lambda item: int(item[0][4:])))


def solve(grid: list[list[str]]) -> HopSolution:
    """Run the synchronized hop solver on a puzzle grid (numbers and ``?`` blanks).

    Args:
        grid: a parsed puzzle grid (see :func:`tokenswap.crossmath.grid.parse_markdown_table`).

    Returns:
        The :class:`HopSolution`; check ``solved`` before trusting ``answers()``.

    Raises:
        ValueError: if the grid holds a malformed equation (see ``find_equations``).

    >>> from tokenswap.crossmath.grid import parse_markdown_table
    >>> grid = parse_markdown_table("| 2 | + | ? | = | 5 |\\n|   |   | × |   |   |\\n|   |   | 4 |   |   |\\n"
    ...                             "|   |   | = |   |   |\\n|   |   | ? |   |   |")
    >>> solution = solve(grid)
    >>> solution.answers(), solution.answer_hops()
    ([3, 12], [1, 2])
    """
    equations = find_equations(grid)
    values: dict[Cell, int | None] = {}
    for equation in equations:
        for r, c in equation.numbers:
            if grid[r][c] != BLANK:
                values[(r, c)] = int(grid[r][c])
    hops: dict[Cell, int] = {}
    steps: list[int | None] = [None] * len(equations)
    derivations: list[list[tuple[int, Cell]]] = []
    known = set(values)
    k = 0
    while True:
        k += 1
        found: dict[Cell, int | None] = {}
        solved_by: list[tuple[int, Cell]] = []
        for index, equation in enumerate(equations):
            unknown = [p for p, cell in enumerate(equation.numbers) if cell not in known]
            if len(unknown) != 1:
                continue
            if steps[index] is None:
                steps[index] = k
            cell = equation.numbers[unknown[0]]
            if cell in found:
                continue
            a, b, c = (values.get(x) for x in equation.numbers)
            others_known = all(values.get(x) is not None for p, x in enumerate(equation.numbers) if p != unknown[0])
            found[cell] = solve_for(unknown[0], equation.op, a, b, c) if others_known else None
            solved_by.append((index, cell))
        if not found:
            break
        # Synchronized: this round's solutions become known only after the whole sweep.
        for cell, value in found.items():
            values[cell] = value
            hops[cell] = k
            known.add(cell)
        derivations.append(solved_by)
    return HopSolution(
        equations=equations,
        values=values,
        hops=hops,
        equation_steps=steps,
        derivations=derivations,
        blanks=blank_cells(grid),
    )


def _derivation(position: int, op: str, a: int, b: int, c: int) -> str:
    if position == 2:
        return f"{a} {op} {b}"
    if position == 0:
        return {"+": f"{c} - {b}", "-": f"{c} + {b}", "×": f"{c} ÷ {b}", "÷": f"{c} × {b}"}[op]
    return {"+": f"{c} - {a}", "-": f"{a} - {c}", "×": f"{c} ÷ {a}", "÷": f"{a} ÷ {c}"}[op]


def _where(equation: Equation) -> str:
    (r0, c0), (r1, c1) = equation.cells[0], equation.cells[-1]
    if equation.direction == "across":
        return f"the across equation in row {r0 + 1} (columns {c0 + 1}-{c1 + 1})"
    return f"the down equation in column {c0 + 1} (rows {r0 + 1}-{r1 + 1})"


def chain_of_thought(grid: list[list[str]]) -> str:
    """Verbalise the solver's rounds as a step-by-step solution ending in ``<answer>…</answer>``.

    Used as the SFT target: each round lists the equations that have exactly one unknown, the
    arithmetic that fills it, and the final answer lists the blanks in answer order.

    Args:
        grid: a puzzle grid with ``?`` blanks.

    Returns:
        The natural-language chain of thought.

    Raises:
        ValueError: if the hop solver cannot determine every blank.
    """
    solution = solve(grid)
    answers = solution.answers()
    known: dict[Cell, int | None] = {
        cell: value for cell, value in solution.values.items() if cell not in solution.hops
    }
    lines = [
        "Cells are named (row, column), counting from 1 at the top left. I solve every equation that has "
        "exactly one unknown, then repeat with the newly found numbers."
    ]
    for k, solved_by in enumerate(solution.derivations, start=1):
        lines.append(f"\nStep {k}:")
        for index, cell in solved_by:
            equation = solution.equations[index]
            position = equation.numbers.index(cell)
            a, b, c = (solution.values[x] for x in equation.numbers)
            value = solution.values[cell]
            shown = equation.render(known)
            lines.append(
                f"- In {_where(equation)}, {shown}: the unknown at ({cell[0] + 1}, {cell[1] + 1}) is "
                f"{_derivation(position, equation.op, a, b, c)} = {value}."
            )
        for _, cell in solved_by:
            known[cell] = solution.values[cell]
    filled = ", ".join(f"({r + 1}, {c + 1}) = {v}" for (r, c), v in zip(solution.blanks, answers))
    lines.append(f"\nAll blanks are filled. In order from top to bottom and left to right: {filled}.")
    lines.append(f"<answer>{' '.join(map(str, answers))}</answer>")
    return "\n".join(lines)
