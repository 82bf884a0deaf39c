"""REST consistency metrics over modalities M = {text, image, mixed} (SPECS §2).

With f(q, m) the extracted answer and C(q, m) = 1[f(q, m) = gold]:

- **RER** (render-equivalence rate) = |{q : f(q, m) equal for every m}| / N. Agreement, not
  correctness: three identical wrong answers are consistent. An unparsable answer (None) agrees
  with nothing, not even another None.
- **CFR** (cross-modality failure rate) = |{q : 1 <= sum_m C(q, m) < |M|}| / N_c, with N_c the
  number of items correct in at least one modality (items failed everywhere are a capability
  gap, not an inconsistency).
- **MMC** (max modal coverage) = N_c / N, the best-modality oracle; reported next to the
  all-correct rate.

Every rate over an empty set is ``None`` (so JSON stays valid and "undefined" is not confused
with 0). Each metric is reported on all items and on the OCR-correct subset.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = [
    "MODALITIES",
    "ItemOutcome",
    "all_correct_rate",
    "consistency_metrics",
    "cross_modality_failure_rate",
    "max_modal_coverage",
    "modality_accuracy",
    "render_equivalence_rate",
    "rest_report",
]

MODALITIES: tuple[str, ...] = ("text", "image", "mixed")


@dataclass(frozen=True, kw_only=True)
class ItemOutcome:
    """The extracted answers of one item in every modality."""

    item_id: str
    gold: str
    """Gold answer in the extractor's canonical form (letter, normalised number, ``A=1,B=2``)."""
    answers: Mapping[str, str | None]
    """modality -> extracted answer (None: invalid format)."""
    ocr_correct: bool | None = None
    """CER = 0 on the item's renderings; None when OCR was not run."""

    def correct(self, modality: str) -> bool:
        """C(q, m): a parsed answer equal to gold. Raises KeyError naming a missing modality."""
        if modality not in self.answers:
            raise KeyError(
                f"item {self.item_id!r} has no answer for modality {modality!r}; has {sorted(self.answers)}"
            )
        answer = self.answers[modality]
        return answer is not None and answer == self.gold

    def n_correct(self, modalities: Sequence[str]) -> int:
        """sum_m C(q, m)."""
        return sum(self.correct(m) for m in modalities)


def _rate(num: int, den: int) -> float | None:
    return num / den if den else None


def render_equivalence_rate(outcomes: Sequence[ItemOutcome], modalities: Sequence[str] = MODALITIES) -> float | None:
    """RER: share of items whose extracted answers are identical (and parsed) in every modality."""
    same = 0
    for o in outcomes:
        answers = [o.answers[m] for m in modalities]
        same += answers[0] is not None and all(a == answers[0] for a in answers)
    return _rate(same, len(outcomes))


def cross_modality_failure_rate(
    outcomes: Sequence[ItemOutcome], modalities: Sequence[str] = MODALITIES
) -> float | None:
    """CFR: among items solved in >= 1 modality, the share not solved in all of them."""
    counts = [o.n_correct(modalities) for o in outcomes]
    solved = [c for c in counts if c >= 1]
    return _rate(sum(c < len(modalities) for c in solved), len(solved))


def max_modal_coverage(outcomes: Sequence[ItemOutcome], modalities: Sequence[str] = MODALITIES) -> float | None:
    """MMC = N_c / N: share of items solved in at least one modality."""
    return _rate(sum(o.n_correct(modalities) >= 1 for o in outcomes), len(outcomes))


def all_correct_rate(outcomes: Sequence[ItemOutcome], modalities: Sequence[str] = MODALITIES) -> float | None:
    """Share of items solved in every modality (the pessimistic counterpart of MMC)."""
    return _rate(sum(o.n_correct(modalities) == len(modalities) for o in outcomes), len(outcomes))


def modality_accuracy(
    outcomes: Sequence[ItemOutcome], modalities: Sequence[str] = MODALITIES
) -> dict[str, float | None]:
    """Accuracy of each modality."""
    return {m: _rate(sum(o.correct(m) for o in outcomes), len(outcomes)) for m in modalities}


def consistency_metrics(outcomes: Sequence[ItemOutcome], modalities: Sequence[str] = MODALITIES) -> dict:
    """RER, CFR, MMC, all-correct rate and per-modality accuracy of one set of items.

    Returns:
        ``{"n", "n_solved", "rer", "cfr", "mmc", "all_correct", "accuracy": {modality: acc}}``.
    """
    return {
        "n": len(outcomes),
        "n_solved": sum(o.n_correct(modalities) >= 1 for o in outcomes),
        "rer": render_equivalence_rate(outcomes, modalities),
        "cfr": cross_modality_failure_rate(outcomes, modalities),
        "mmc": max_modal_coverage(outcomes, modalities),
        "all_correct": all_correct_rate(outcomes, modalities),
        "accuracy": modality_accuracy(outcomes, modalities),
    }


def rest_report(outcomes: Sequence[ItemOutcome], modalities: Sequence[str] = MODALITIES) -> dict:
    """:func:`consistency_metrics` on all items and on the OCR-correct subset.

    Returns:
        ``{"all": {...}, "ocr_correct": {...} | None}``; ``ocr_correct`` is None when no item has
        OCR information, and covers only items with ``ocr_correct is True`` otherwise.
    """
    has_ocr = any(o.ocr_correct is not None for o in outcomes)
    return {
        "all": consistency_metrics(outcomes, modalities),
        "ocr_correct": (consistency_metrics([o for o in outcomes if o.ocr_correct], modalities) if has_ocr else None),
    }
