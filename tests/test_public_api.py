"""The top-level API: the main classes import from ``tokenswap``, and ``import tokenswap`` stays light."""

from __future__ import annotations

import subprocess
import sys

import pytest


def test_main_classes_import_from_the_top_level():
    from tokenswap import GapEvalCallback, GapEvaluator, ImageStore, SwapPolicy, TokenSwapCollator
    from tokenswap.collator import TokenSwapCollator as direct

    assert TokenSwapCollator is direct
    assert {c.__name__ for c in (GapEvalCallback, GapEvaluator, ImageStore, SwapPolicy)} == {
        "GapEvalCallback", "GapEvaluator", "ImageStore", "SwapPolicy"}


@pytest.mark.integration
def test_import_tokenswap_loads_neither_torch_nor_transformers():
    code = "import sys, tokenswap; print(sorted(m for m in ('torch', 'transformers') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_unknown_name_is_an_attribute_error():
    import pytest

    import tokenswap

    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        tokenswap.Nope  # noqa: B018
