"""Recipe modules loaded from their files (recipes/ is not a package)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

RECIPES = Path(__file__).resolve().parents[2] / "recipes"


def _load_recipe(name: str):
    spec = importlib.util.spec_from_file_location(f"recipe_{name}", RECIPES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve string annotations through sys.modules
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def load_recipe():
    """``load_recipe("post_train")`` -> the recipe module."""
    return _load_recipe
