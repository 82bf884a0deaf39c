"""SoEBench: generated systems of linear equations with a unique integer solution.

Only digits 0-9, the variables A-E and ``+ - =`` appear, so OCR is nearly trivial and the items
are new (no contamination). Each system is square (as many equations as variables) with
integer coefficients in [-9, 9], at least two terms per equation, and a solution drawn from
``value_range``. Uniqueness is proved exactly: the integer determinant (fraction-free Bareiss
elimination) is non-zero, and exact rational elimination recovers the drawn solution.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from tokenswap.rest.items import RestItem

__all__ = [
    "LinearSystem",
    "format_equation",
    "generate_system",
    "integer_determinant",
    "soebench_item",
    "soebench_items",
    "solve_exact",
]

VARIABLES = "ABCDE"


@dataclass(frozen=True, kw_only=True)
class LinearSystem:
    """``coefficients @ solution == constants`` over ``variables``."""

    variables: str
    coefficients: tuple[tuple[int, ...], ...]
    constants: tuple[int, ...]
    solution: tuple[int, ...]


def integer_determinant(matrix: Sequence[Sequence[int]]) -> int:
    """Exact determinant of a square integer matrix (Bareiss fraction-free elimination)."""
    m = [list(row) for row in matrix]
    n = len(m)
    if any(len(row) != n for row in m):
        raise ValueError(f"matrix must be square, got {n} rows of lengths {[len(r) for r in m]}")
    sign, previous = 1, 1
    for k in range(n - 1):
        if m[k][k] == 0:
            swap = next((i for i in range(k + 1, n) if m[i][k] != 0), None)
            if swap is None:
                return 0
            m[k], m[swap] = m[swap], m[k]
            sign = -sign
        for i in range(k + 1, n):
            for j in range(k + 1, n):
                # Exact by Sylvester's identity: every intermediate is itself a minor, hence an integer.
                m[i][j] = (m[i][j] * m[k][k] - m[i][k] * m[k][j]) // previous
        previous = m[k][k]
    return sign * m[n - 1][n - 1] if n else 1


def solve_exact(coefficients: Sequence[Sequence[int]], constants: Sequence[int]) -> list[Fraction] | None:
    """The unique rational solution by Gauss-Jordan elimination over Fractions; None if singular."""
    n = len(coefficients)
    aug = [[Fraction(v) for v in row] + [Fraction(c)] for row, c in zip(coefficients, constants)]
    for col in range(n):
        pivot = next((r for r in range(col, n) if aug[r][col] != 0), None)
        if pivot is None:
            return None
        aug[col], aug[pivot] = aug[pivot], aug[col]
        aug[col] = [v / aug[col][col] for v in aug[col]]
        for r in range(n):
            if r != col and aug[r][col] != 0:
                factor = aug[r][col]
                aug[r] = [a - factor * b for a, b in zip(aug[r], aug[col])]
    return [row[-1] for row in aug]


def generate_system(
    rng: random.Random, n_vars: int, coef_range: tuple[int, int] = (-9, 9), value_range: tuple[int, int] = (0, 9)
) -> LinearSystem:
    """Draw a square system with a unique integer solution (rejection sampling on the determinant).

    Args:
        rng: random source (the only source of randomness).
        n_vars: number of variables and equations, 1-5.
        coef_range: inclusive coefficient range; single digits keep the symbol set to 0-9.
        value_range: inclusive range of the solution values.
    """
    if not 1 <= n_vars <= len(VARIABLES):
        raise ValueError(f"n_vars must be in [1, {len(VARIABLES)}], got {n_vars}")
    min_terms = min(2, n_vars)
    solution = tuple(rng.randint(*value_range) for _ in range(n_vars))
    while True:
        rows = []
        for _ in range(n_vars):
            row = [0] * n_vars
            while sum(c != 0 for c in row) < min_terms:
                row = [rng.randint(*coef_range) for _ in range(n_vars)]
            rows.append(tuple(row))
        if integer_determinant(rows) != 0:
            break
    constants = tuple(sum(c * x for c, x in zip(row, solution)) for row in rows)
    return LinearSystem(variables=VARIABLES[:n_vars], coefficients=tuple(rows), constants=constants, solution=solution)


def format_equation(coefficients: Sequence[int], constant: int, variables: str) -> str:
    """``(2, -1, 0), 5, "ABC"`` -> ``"2A - B = 5"``."""
    terms = []
    for c, v in zip(coefficients, variables):
        if c == 0:
            continue
        magnitude = "" if abs(c) == 1 else str(abs(c))
        if not terms:
            terms.append(f"{'-' if c < 0 else ''}{magnitude}{v}")
        else:
            terms.append(f"{'-' if c < 0 else '+'} {magnitude}{v}")
    return f"{' '.join(terms)} = {constant}"


def _question(variables: str) -> str:
    names = ", ".join(variables[:-1]) + f" and {variables[-1]}" if len(variables) > 1 else variables
    return f"What are the values of {names}?"


def soebench_item(system: LinearSystem, item_id: str) -> RestItem:
    """A REST item: the equations (one per line) then the question; mixed = equations image + question text."""
    stem = "\n".join(format_equation(r, c, system.variables) for r, c in zip(system.coefficients, system.constants))
    query = _question(system.variables)
    return RestItem(
        id=item_id,
        source="soebench",
        answer_type="soe",
        gold=",".join(f"{v}={x}" for v, x in zip(system.variables, system.solution)),
        options=system.variables,
        text=f"{stem}\n{query}",
        stem=stem,
        query=query,
        meta={
            "coefficients": [list(r) for r in system.coefficients],
            "constants": list(system.constants),
            "solution": list(system.solution),
        },
    )


def soebench_items(
    n: int, seed: int = 0, min_vars: int = 2, max_vars: int = 5, value_range: tuple[int, int] = (0, 9)
) -> list[RestItem]:
    """``n`` SoEBench items; item ``i`` depends only on ``(seed, i)``, so a longer run extends a shorter one.

    Args:
        n: number of items.
        seed: generation seed.
        min_vars: fewest variables per system.
        max_vars: most variables per system (at most 5: A-E).
        value_range: inclusive range of the solution values.
    """
    if not 1 <= min_vars <= max_vars <= len(VARIABLES):
        raise ValueError(f"need 1 <= min_vars <= max_vars <= 5, got min_vars={min_vars}, max_vars={max_vars}")
    items = []
    for i in range(n):
        rng = random.Random(f"soebench-{seed}-{i}")
        system = generate_system(rng, rng.randint(min_vars, max_vars), value_range=value_range)
        items.append(soebench_item(system, f"soebench-{seed}-{i:05d}"))
    return items
