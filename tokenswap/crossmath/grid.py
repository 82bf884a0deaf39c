"""The CrossMath grid: cells, glyphs, the markdown text format and equation detection.

A grid is a ``list[list[str]]`` of cell contents: a number (``"12"``), a blank (``"?"``), an
operator (``"+" "-" "×" "÷"``), ``"="`` or ``""`` for an empty cell. Numbers and blanks sit
at (even row, even column); operators and ``=`` where exactly one index is odd. An equation is
a maximal horizontal (read left to right) or vertical (read top to bottom) run of at least
three non-empty cells that contains ``=``; every equation is exactly ``a op b = c``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

__all__ = [
    "BLANK",
    "OPERATORS",
    "Cell",
    "Equation",
    "apply_operator",
    "blank_cells",
    "find_equations",
    "format_markdown_table",
    "normalize_glyph",
    "normalize_operators",
    "operators_ascii",
    "parse_markdown_table",
    "solve_for",
]

Cell = tuple[int, int]
"""``(row, col)``, 0-based."""

BLANK = "?"
OPERATORS = ("+", "-", "×", "÷")
"""Canonical operator glyphs, as in the released markdown (ASCII ``-``, U+00D7, U+00F7)."""

# The released data writes × as x in one puzzle, and people type * and /: accept them all.
_GLYPHS = {"x": "×", "X": "×", "*": "×", "×": "×", "÷": "÷", "/": "÷", "−": "-", "-": "-", "+": "+", "=": "="}
_ASCII = {"+": "+", "-": "-", "×": "*", "÷": "/"}


def normalize_glyph(content: str) -> str:
    """Map an operator glyph to its canonical form; numbers, blanks and ``""`` pass through.

    >>> normalize_glyph("x"), normalize_glyph("/"), normalize_glyph("12")
    ('×', '÷', '12')
    """
    return _GLYPHS.get(content, content)


def normalize_operators(operators: str) -> str:
    """Normalise an operator set such as ``"+-*/"`` or ``"+×"`` to canonical glyphs, in ``+ - × ÷`` order.

    Raises:
        ValueError: if a character is not one of ``+ - × ÷`` or their aliases, or the set is empty.
    """
    glyphs = set()
    for ch in operators:
        glyph = _GLYPHS.get(ch)
        if glyph not in OPERATORS:
            raise ValueError(f"operators must use + - * / (or × ÷ x), got {ch!r} in {operators!r}")
        glyphs.add(glyph)
    if not glyphs:
        raise ValueError("operators must name at least one of + - * /, got an empty string")
    return "".join(op for op in OPERATORS if op in glyphs)


def operators_ascii(operators: str) -> str:
    """The released record spelling of an operator set: ``"+-*/"`` for all four."""
    return "".join(_ASCII[op] for op in normalize_operators(operators))


def apply_operator(a: int, op: str, b: int) -> int | None:
    """``a op b`` if it is a non-negative integer, else ``None`` (negative or inexact division).

    >>> apply_operator(12, "÷", 4), apply_operator(12, "÷", 5), apply_operator(3, "-", 5)
    (3, None, None)
    """
    if op == "+":
        value = a + b
    elif op == "-":
        value = a - b
    elif op == "×":
        value = a * b
    elif op == "÷":
        if b == 0 or a % b:
            return None
        value = a // b
    else:
        raise ValueError(f"unknown operator {op!r}; expected one of {OPERATORS}")
    return value if value >= 0 else None


def solve_for(position: int, op: str, a: int | None, b: int | None, c: int | None) -> int | None:
    """Solve ``a op b = c`` for the cell at ``position`` (0 = a, 1 = b, 2 = c) given the other two.

    Returns ``None`` when no non-negative integer solves it, or when the solution is not unique
    (``0 × b = 0`` leaves ``b`` open).

    >>> solve_for(0, "-", None, 4, 9), solve_for(1, "÷", 20, None, 5), solve_for(2, "×", 6, 7, None)
    (13, 4, 42)
    """
    if position == 2:
        return apply_operator(a, op, b)
    if position == 0:  # a = c inverse-op b
        if op == "+":
            return c - b if c >= b else None
        if op == "-":
            return c + b
        if op == "×":
            return c // b if b and c % b == 0 else None
        return c * b if b else None
    if op == "+":  # b, knowing a and c
        return c - a if c >= a else None
    if op == "-":
        return a - c if a >= c else None
    if op == "×":
        return c // a if a and c % a == 0 else None
    return a // c if c and a % c == 0 else None


@dataclass(frozen=True)
class Equation:
    """One ``a op b = c`` run of five cells.

    Attributes:
        cells: the five cells in reading order (left to right, or top to bottom).
        op: the canonical operator glyph.
        direction: ``"across"`` or ``"down"``.
    """

    cells: tuple[Cell, Cell, Cell, Cell, Cell]
    op: str
    direction: Literal["across", "down"]

    @property
    def numbers(self) -> tuple[Cell, Cell, Cell]:
        """The ``a``, ``b`` and ``c`` cells."""
        return self.cells[0], self.cells[2], self.cells[4]

    def render(self, values: dict[Cell, int | None], sep: str = " ") -> str:
        """``"a op b = c"`` with the given values, ``?`` where a value is missing.

        ``sep=""`` gives the released ``solutions``/``solving_steps`` spelling, ``"23+10=33"``.
        """
        a, b, c = (values.get(cell) for cell in self.numbers)
        show = ["?" if v is None else str(v) for v in (a, b, c)]
        return sep.join((show[0], self.op, show[1], "=", show[2]))


def parse_markdown_table(text: str, normalize: bool = True) -> list[list[str]]:
    """Parse the CrossMath markdown table (no header row) into a grid of normalised cell contents.

    Args:
        text: rows joined by newlines, each ``| c1 | c2 | ... |``; blank lines are ignored.
        normalize: map operator aliases to canonical glyphs; ``False`` keeps the cells as written (to draw
            a released puzzle as it was drawn: 0043's ``x`` cells are number-coloured in its picture).

    Returns:
        The grid; empty cells are ``""``, operator aliases (``x X * /``) are mapped to ``× ÷`` if ``normalize``.

    Raises:
        ValueError: if a line is not wrapped in ``|`` or rows have different lengths.

    >>> parse_markdown_table("| 1 | + | ? |\\n|   |   | x |")
    [['1', '+', '?'], ['', '', '×']]
    """
    grid = []
    for number, line in enumerate(text.strip("\n").split("\n"), start=1):
        line = line.strip()
        if not line:
            continue
        if len(line) < 2 or line[0] != "|" or line[-1] != "|":
            raise ValueError(f"markdown_table line {number} must start and end with '|', got {line!r}")
        cells = [cell.strip() for cell in line[1:-1].split("|")]
        grid.append([normalize_glyph(cell) for cell in cells] if normalize else cells)
    if not grid:
        raise ValueError("markdown_table is empty")
    widths = {len(row) for row in grid}
    if len(widths) != 1:
        raise ValueError(f"markdown_table rows must all have the same number of cells, got widths {sorted(widths)}")
    return grid


def format_markdown_table(grid: list[list[str]]) -> str:
    """The CrossMath text format: one ``|``-wrapped line per row, each cell ``" " + content + " "``.

    An empty cell's content is a single space (``|   |``); there is no header row.

    >>> print(format_markdown_table([["1", "+", "?"], ["", "", "×"]]))
    | 1 | + | ? |
    |   |   | × |
    """
    return "\n".join("|" + "|".join(f" {cell or ' '} " for cell in row) + "|" for row in grid)


def blank_cells(grid: list[list[str]]) -> list[Cell]:
    """The ``?`` cells in answer order: rows top to bottom, cells left to right."""
    return [(r, c) for r, row in enumerate(grid) for c, cell in enumerate(row) if cell == BLANK]


def _is_number_or_blank(content: str) -> bool:
    return content == BLANK or content.isdigit()


def find_equations(grid: list[list[str]]) -> list[Equation]:
    """All equations of a grid: across ones in row-major order of their first cell, then down ones.

    Raises:
        ValueError: if a run containing ``=`` is not exactly ``a op b = c`` (five cells, numbers or
            ``?`` at 0, 2 and 4, an operator at 1, ``=`` at 3).
    """
    rows, cols = len(grid), len(grid[0])
    equations: list[Equation] = []
    for direction in ("across", "down"):
        outer, inner = (rows, cols) if direction == "across" else (cols, rows)
        runs: list[list[Cell]] = []
        for i in range(outer):
            run: list[Cell] = []
            for j in range(inner + 1):
                cell = (i, j) if direction == "across" else (j, i)
                if j < inner and grid[cell[0]][cell[1]]:
                    run.append(cell)
                    continue
                if len(run) >= 3 and any(grid[r][c] == "=" for r, c in run):
                    runs.append(run)
                run = []
        if direction == "down":
            runs.sort(key=lambda run: run[0])
        for run in runs:
            contents = [grid[r][c] for r, c in run]
            ok = (
                len(run) == 5
                and contents[1] in OPERATORS
                and contents[3] == "="
                and all(_is_number_or_blank(contents[k]) for k in (0, 2, 4))
            )
            if not ok:
                raise ValueError(
                    f"the {direction} run starting at row {run[0][0]}, col {run[0][1]} reads {contents}; every "
                    "equation must be 5 cells 'a op b = c' with op in + - × ÷"
                )
            equations.append(Equation(cells=tuple(run), op=contents[1], direction=direction))
    return equations
