"""The doctests in tokenswap.crossmath (worked examples of every reward and metric) must hold."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["__init__", "grid", "solver", "generator", "metrics", "rewards"]


@pytest.mark.parametrize("name", MODULES)
def test_module_doctests(name):
    module = importlib.import_module("tokenswap.crossmath" if name == "__init__" else f"tokenswap.crossmath.{name}")
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no doctests"
    assert result.failed == 0
