"""Scoring wiring: stored responses -> per-variant REST metrics, OCR subset and OCR-first delta."""

from __future__ import annotations

import pytest

from tokenswap.rest.evaluate import TEXT_VARIANT, score_predictions
from tokenswap.rest.soebench import soebench_items


def _predictions(table):
    return {f"{i}|{t}|{v}": {"response": r} for (i, t, v), r in table.items()}


def test_score_predictions_oracle_and_ocr_failure():
    a, b = soebench_items(2, seed=0)
    wrong = "A=99" + "".join(f", {v}=99" for v in a.options[1:])
    table = {}
    for item in (a, b):
        table[(item.id, "text", TEXT_VARIANT)] = f"Answer: {item.gold.replace(',', ', ')}"
        table[(item.id, "image", "sans_200")] = f"Answer: {item.gold}"
        table[(item.id, "ocr_stem", "sans_200")] = item.stem
        table[(item.id, "ocr_first", "sans_200")] = f"Answer: {item.gold}"
    # Item a: mixed wrong, OCR exact (line breaks differ only). Item b: mixed right, OCR has a typo.
    table[(a.id, "mixed", "sans_200")] = wrong
    table[(a.id, "ocr_item", "sans_200")] = a.text.replace("\n", "  ")
    table[(b.id, "mixed", "sans_200")] = f"so {b.gold}"
    table[(b.id, "ocr_item", "sans_200")] = b.text[:-1] + "!"
    table[(b.id, "ocr_first", "sans_200")] = "I cannot read it"

    result = score_predictions([a, b], _predictions(table), ["sans_200"], ocr=True)["sans_200"]
    assert result["all"]["accuracy"] == {"text": 1.0, "image": 1.0, "mixed": 0.5}
    assert result["all"]["rer"] == 0.5 and result["all"]["cfr"] == 0.5 and result["all"]["mmc"] == 1.0
    assert result["ocr"]["ocr_correct_rate"] == 0.5
    assert result["ocr"]["mean_cer_item"] == pytest.approx(0.5 / len(b.text))
    assert result["ocr_correct"]["n"] == 1 and result["ocr_correct"]["rer"] == 0.0  # only item a
    assert result["ocr_first"] == {"acc_image": 1.0, "acc_ocr_first": 0.5, "delta_acc": -0.5}
