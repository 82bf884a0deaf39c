"""RER / CFR / MMC on hand-built prediction tables with exact expected values."""

from __future__ import annotations

import pytest

from tokenswap.rest.metrics import (
    ItemOutcome,
    consistency_metrics,
    cross_modality_failure_rate,
    max_modal_coverage,
    render_equivalence_rate,
    rest_report,
)


def row(item_id, gold, text, image, mixed, ocr=None):
    return ItemOutcome(
        item_id=item_id, gold=gold, answers={"text": text, "image": image, "mixed": mixed}, ocr_correct=ocr
    )


TABLE = [
    row("all-right", "A", "A", "A", "A", ocr=True),  # consistent, correct everywhere
    row("consistent-but-wrong", "A", "B", "B", "B", ocr=True),  # consistent, wrong everywhere
    row("solved-in-one", "C", "C", "D", "A", ocr=True),  # solved in text only
    row("solved-in-two", "7", "7", "7", None, ocr=False),  # OCR-incorrect row; mixed unparsable
    row("failed-everywhere", "D", "A", "B", None, ocr=True),  # inconsistent and never solved
    row("all-unparsable", "B", None, None, None, ocr=False),  # None never agrees with None
]


def test_rer_counts_agreement_not_correctness():
    # all-right and consistent-but-wrong agree; nothing else does.
    assert render_equivalence_rate(TABLE) == pytest.approx(2 / 6)


def test_cfr_over_items_solved_somewhere():
    # Solved somewhere: all-right, solved-in-one, solved-in-two (N_c = 3); not everywhere: the last two.
    assert cross_modality_failure_rate(TABLE) == pytest.approx(2 / 3)


def test_mmc_is_best_modality_oracle():
    assert max_modal_coverage(TABLE) == pytest.approx(3 / 6)


def test_full_metrics_and_ocr_subset():
    report = rest_report(TABLE)
    everything = report["all"]
    assert everything["n"] == 6 and everything["n_solved"] == 3
    assert everything["all_correct"] == pytest.approx(1 / 6)
    assert everything["accuracy"] == pytest.approx({"text": 3 / 6, "image": 2 / 6, "mixed": 1 / 6})

    subset = report["ocr_correct"]  # all-right, consistent-but-wrong, solved-in-one, failed-everywhere
    assert subset["n"] == 4 and subset["n_solved"] == 2
    assert subset["rer"] == pytest.approx(2 / 4)
    assert subset["cfr"] == pytest.approx(1 / 2)
    assert subset["mmc"] == pytest.approx(2 / 4)
    assert subset["accuracy"] == pytest.approx({"text": 2 / 4, "image": 1 / 4, "mixed": 1 / 4})


def test_undefined_rates_are_none():
    nothing_solved = [row("x", "A", "B", "C", "D")]
    assert cross_modality_failure_rate(nothing_solved) is None
    empty = consistency_metrics([])
    assert empty["rer"] is None and empty["cfr"] is None and empty["mmc"] is None
    assert rest_report(nothing_solved)["ocr_correct"] is None  # OCR not run


def test_missing_modality_names_it():
    bad = ItemOutcome(item_id="q", gold="A", answers={"text": "A", "image": "A"})
    with pytest.raises(KeyError, match="mixed"):
        cross_modality_failure_rate([bad])
