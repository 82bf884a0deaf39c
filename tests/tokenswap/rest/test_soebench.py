"""SoEBench: every system has exactly one solution, it is the integer solution we drew, and rendering is clean."""

from __future__ import annotations

import random
import re
from fractions import Fraction

from hypothesis import given, settings
from hypothesis import strategies as st

from tokenswap.rest.soebench import (
    format_equation,
    generate_system,
    integer_determinant,
    soebench_items,
    solve_exact,
)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n_vars=st.integers(1, 5))
def test_every_system_has_a_unique_integer_solution(seed, n_vars):
    system = generate_system(random.Random(seed), n_vars)
    assert integer_determinant(system.coefficients) != 0  # unique
    solution = solve_exact(system.coefficients, system.constants)
    assert solution == [Fraction(x) for x in system.solution]
    assert all(0 <= x <= 9 for x in system.solution)
    for row in system.coefficients:
        assert all(-9 <= c <= 9 for c in row)
        assert sum(c != 0 for c in row) >= min(2, n_vars)


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 10_000))
def test_items_use_only_digits_variables_and_operators(seed):
    for item in soebench_items(3, seed=seed):
        stem_symbols = set(item.stem.replace("\n", " "))
        assert stem_symbols <= set("0123456789ABCDE+-= ")
        # The gold answer satisfies every rendered equation.
        values = dict(kv.split("=") for kv in item.gold.split(","))
        for line in item.stem.splitlines():
            lhs, rhs = line.split(" = ")
            total = sum(
                int(sign.replace(" ", "") + (coef or "1")) * int(values[var])
                for sign, coef, var in re.findall(r"([+-]?\s?)(\d*)([A-E])", lhs)
            )
            assert total == int(rhs)


def test_integer_determinant_matches_known_values():
    assert integer_determinant([[2]]) == 2
    assert integer_determinant([[1, 2], [3, 4]]) == -2
    assert integer_determinant([[0, 1], [1, 0]]) == -1
    assert integer_determinant([[1, 2], [2, 4]]) == 0
    assert integer_determinant([[2, -3, 1], [2, 0, -1], [1, 4, 5]]) == 49
    assert solve_exact([[1, 2], [2, 4]], [1, 2]) is None


def test_format_equation():
    assert format_equation((2, -1, 0), 5, "ABC") == "2A - B = 5"
    assert format_equation((-1, 0, 3), -7, "ABC") == "-A + 3C = -7"


def test_items_are_seed_deterministic_and_prefix_stable():
    assert [i.to_dict() for i in soebench_items(5, seed=3)][:3] == [i.to_dict() for i in soebench_items(3, seed=3)]
    assert soebench_items(2, seed=3)[0].text != soebench_items(2, seed=4)[0].text
