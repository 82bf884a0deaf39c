"""Answer extraction and the CrossMath metrics (SPECS §1.6).

* micro accuracy: mean over puzzles of (#positions ``j`` with ``pred[j] == gold[j]``) / ``len(gold)``;
* macro accuracy: mean over puzzles of ``pred == gold`` (so the lengths must match);
* K-hop accuracy: pooled over all blanks of hop 1, 2, 3 and 4+ (``step4+``).

Comparison is an exact string match per position (``"12.0" != "12"``); missing positions are
wrong, and a response without ``<answer>`` predicts nothing. Runs are summarised as mean ±
sample standard deviation, ×100.

Every input the official ``calc_metric.py`` (github ``xuyige/CrossMath``) scores is scored the same
way here: a run with fewer predictions than puzzles is scored on the puzzles it covers (the first
``len(preds)``) and predictions past the last puzzle are ignored; a hop bucket without blanks scores
0.0; a single run's standard deviation is 0.0; step labels may read ``step3``, ``Step 3``, ``3`` or
``third``. The one deliberate difference: for a single run the official summary prints the mean as
a fraction, here it is ×100 like every other mean.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Sequence

__all__ = [
    "HOP_BUCKETS",
    "aggregate_runs",
    "extract_answer",
    "format_metrics_table",
    "gold_answer",
    "gold_hops",
    "hop_bucket",
    "khop_accuracy",
    "macro_accuracy",
    "micro_accuracy",
    "position_matches",
    "score_run",
]

HOP_BUCKETS = ("step1", "step2", "step3", "step4+")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)
_SEPARATORS = str.maketrans({"|": " ", ",": " ", "\t": " "})


def extract_answer(response: str) -> list[str] | None:
    """The tokens of the last ``<answer>…</answer>`` in a response, or ``None`` if there is none.

    ``|``, ``,`` and tabs separate like spaces.

    >>> extract_answer("try <answer>1 2</answer> no: <ANSWER>3, 4 | 5</ANSWER>")
    ['3', '4', '5']
    >>> extract_answer("the answer is 3 4") is None
    True
    """
    matches = _ANSWER.findall(response)
    if not matches:
        return None
    return matches[-1].translate(_SEPARATORS).split()


def _cells(table: str) -> list[str]:
    return [cell.strip() for cell in table.split("|") if cell.strip()]


def gold_answer(record: dict) -> list[str]:
    """The gold tokens of a record: ``markdown_answer`` split on ``|``, stripped, empties dropped (row-major).

    Raises:
        KeyError: if the record has no ``markdown_answer``.
    """
    return _cells(record["markdown_answer"])


_ORDINALS = {"first": 1, "second": 2, "third": 3}


def _label_hop(label: str) -> int | None:
    # The official script's reading: the first integer in the label, else an ordinal word.
    number = re.search(r"\d+", label)
    if number:
        return int(number.group())
    lowered = label.lower()
    return next((hop for word, hop in _ORDINALS.items() if word in lowered), None)


def gold_hops(record: dict) -> list[int]:
    """The hop of each gold position, from ``markdown_answer_step`` (``"step3"``, ``"Step 3"``, ``"3"`` → 3).

    Raises:
        KeyError: if the record has no ``markdown_answer_step``.
        ValueError: if a cell names no hop (the official script would bucket it as ``step4+``; the hop
            also weighs the GRPO reward, so it is not guessed here).
    """
    hops = []
    for cell in _cells(record["markdown_answer_step"]):
        hop = _label_hop(cell)
        if hop is None:
            raise ValueError(f"markdown_answer_step cells must read 'step<k>', got {cell!r}")
        hops.append(hop)
    return hops


def hop_bucket(hop: int) -> str:
    """``step1``, ``step2``, ``step3`` or ``step4+`` (as in the official script, ``step0`` counts as 4+)."""
    return f"step{hop}" if 1 <= hop < 4 else "step4+"


def position_matches(pred: Sequence[str] | None, gold: Sequence[str]) -> list[bool]:
    """Per gold position, whether the prediction has exactly that string there (missing = wrong)."""
    pred = pred or []
    return [j < len(pred) and pred[j] == g for j, g in enumerate(gold)]


def _paired(preds: Sequence, golds: Sequence) -> tuple[Sequence, Sequence]:
    # The official script scores a partial run on the puzzles it reached (e.g. 120 of 250 after a crash)
    # and ignores predictions past the last puzzle; the mean is over the puzzles scored.
    n = min(len(preds), len(golds))
    if n == 0:
        raise ValueError(f"no puzzles to score: got {len(preds)} predictions for {len(golds)} gold answers")
    if any(len(g) == 0 for g in golds[:n]):
        raise ValueError("a gold answer is empty; every puzzle needs at least one blank")
    return preds[:n], golds[:n]


def micro_accuracy(preds: Sequence[Sequence[str] | None], golds: Sequence[Sequence[str]]) -> float:
    """Mean over puzzles of the fraction of gold positions matched (over the first ``min(len(preds), len(golds))``).

    >>> micro_accuracy([["1", "2"], None], [["1", "3"], ["4"]])
    0.25
    >>> micro_accuracy([["1", "2"]], [["1", "3"], ["4"]])  # a partial run: the puzzles it covers
    0.5
    """
    preds, golds = _paired(preds, golds)
    return sum(sum(position_matches(p, g)) / len(g) for p, g in zip(preds, golds)) / len(golds)


def macro_accuracy(preds: Sequence[Sequence[str] | None], golds: Sequence[Sequence[str]]) -> float:
    """Fraction of puzzles answered exactly (same tokens, same length).

    >>> macro_accuracy([["1", "2"], ["4", "5"]], [["1", "2"], ["4"]])
    0.5
    """
    preds, golds = _paired(preds, golds)
    return sum(list(p or []) == list(g) for p, g in zip(preds, golds)) / len(golds)


def khop_accuracy(
    preds: Sequence[Sequence[str] | None], golds: Sequence[Sequence[str]], hops: Sequence[Sequence[int]]
) -> dict[str, float]:
    """Accuracy pooled over all blanks of each hop bucket; 0.0 for a bucket with no blanks (as the official script).

    >>> khop_accuracy([["1", "9", "3"]], [["1", "2", "3"]], [[1, 2, 5]])
    {'step1': 1.0, 'step2': 0.0, 'step3': 0.0, 'step4+': 1.0}
    """
    preds, golds = _paired(preds, golds)
    correct = dict.fromkeys(HOP_BUCKETS, 0)
    total = dict.fromkeys(HOP_BUCKETS, 0)
    for p, g, h in zip(preds, golds, hops):
        if len(h) != len(g):
            raise ValueError(f"got {len(h)} hops for a gold answer of {len(g)} tokens; they must align")
        for ok, hop in zip(position_matches(p, g), h):
            total[hop_bucket(hop)] += 1
            correct[hop_bucket(hop)] += ok
    return {b: correct[b] / total[b] if total[b] else 0.0 for b in HOP_BUCKETS}


def score_run(
    preds: Sequence[Sequence[str] | None], golds: Sequence[Sequence[str]], hops: Sequence[Sequence[int]]
) -> dict[str, float]:
    """All metrics of one run, as fractions: ``micro``, ``macro``, ``step1`` … ``step4+``."""
    return {"micro": micro_accuracy(preds, golds), "macro": macro_accuracy(preds, golds)} | khop_accuracy(
        preds, golds, hops
    )


def aggregate_runs(runs: Sequence[dict[str, float]]) -> dict[str, tuple[float, float]]:
    """Mean and sample standard deviation across runs, ×100; std is 0.0 for a single run (as the official script).

    >>> aggregate_runs([{"micro": 0.5}, {"micro": 0.7}])["micro"]
    (60.0, 14.142135623730951)
    """
    if not runs:
        raise ValueError("aggregate_runs needs at least one run")
    out = {}
    for key in runs[0]:
        values = [100 * run[key] for run in runs]
        std = statistics.stdev(values) if len(values) > 1 else 0.0
        out[key] = (statistics.fmean(values), std)
    return out


def format_metrics_table(rows: dict[str, dict[str, tuple[float, float]]]) -> str:
    """A markdown table with one row per setting (e.g. modality) and one column per metric.

    Args:
        rows: ``{setting: aggregate_runs(...)}``.

    Returns:
        The table; cells read ``mean ± std``.
    """
    keys = ["micro", "macro", *HOP_BUCKETS]
    lines = ["| setting | " + " | ".join(keys) + " |", "|" + "---|" * (len(keys) + 1)]
    for name, metrics in rows.items():
        cells = [f"{metrics[key][0]:.2f} ± {metrics[key][1]:.2f}" for key in keys]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
