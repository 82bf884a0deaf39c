"""CrossMath rewards for GRPO, with TRL's reward-function signature.

Each function takes ``completions`` (strings, or conversational ``[{"role": "assistant",
"content": ...}]`` lists) plus dataset columns as keyword arguments, and returns one float
per completion, or ``None`` to skip a sample that has no CrossMath gold (e.g. in a mixture).
Positions are aligned exactly as micro accuracy aligns them: token ``j`` of the last
``<answer>`` against gold ``j``, missing tokens wrong.

The dataset columns are ``answer`` (gold tokens, a list or a space-separated string) and
``answer_hops`` (the hop of each gold token); :func:`tokenswap.crossmath.data.reward_columns`
builds both from a record.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Literal

from tokenswap.crossmath.metrics import extract_answer, position_matches

__all__ = [
    "REWARDS",
    "completion_text",
    "format_reward",
    "get_hop_weighted_reward",
    "hop_weighted_reward",
    "hop_weights",
    "micro_accuracy_reward",
    "validate_hop_weighting",
]

Weighting = Literal["linear", "power", "affine", "uniform"]


def completion_text(completion: str | list[dict]) -> str:
    """The text of a completion: the string itself, or the last message's content (text parts joined).

    >>> completion_text([{"role": "assistant", "content": "<answer>3</answer>"}])
    '<answer>3</answer>'
    """
    if isinstance(completion, str):
        return completion
    content = completion[-1]["content"]
    if isinstance(content, str):
        return content
    return "".join(part["text"] for part in content if part["type"] == "text")


def _gold(answer: str | Sequence[str]) -> list[str]:
    return answer.split() if isinstance(answer, str) else [str(a) for a in answer]


def validate_hop_weighting(weighting: str, p: float = 1.0, alpha: float = 1.0) -> None:
    """Reject weightings that do not grow with hop (the point of the reward is that deeper blanks count more).

    Args:
        weighting: ``linear``, ``power``, ``affine`` or ``uniform``.
        p: exponent of ``power``: must be finite and >= 0 (p < 0 gives weights that fall with hop).
        alpha: slope of ``affine``: must be finite and >= 0 (alpha < 0 falls with hop, and alpha = -1
            gives hop-2 blanks weight 0 and a 0/0 reward on puzzles with only hop-2 blanks).

    Raises:
        ValueError: naming the field (``reward.weighting``, ``reward.p`` or ``reward.alpha``) and the fix.

    >>> validate_hop_weighting("affine", alpha=-1)
    Traceback (most recent call last):
    ...
    ValueError: reward.alpha must be >= 0 for the affine weighting (w = 1 + alpha*(hop-1) must not fall with hop), got -1
    """
    if weighting not in ("linear", "power", "affine", "uniform"):
        raise ValueError(f"reward.weighting must be one of linear, power, affine, uniform; got {weighting!r}")
    if weighting == "power" and not (math.isfinite(p) and p >= 0):
        raise ValueError(f"reward.p must be >= 0 for the power weighting (w = hop**p must not fall with hop), got {p}")
    if weighting == "affine" and not (math.isfinite(alpha) and alpha >= 0):
        raise ValueError(
            "reward.alpha must be >= 0 for the affine weighting (w = 1 + alpha*(hop-1) must not fall with hop), "
            f"got {alpha}"
        )


def hop_weights(
    hops: Sequence[int], weighting: Weighting = "linear", p: float = 1.0, alpha: float = 1.0
) -> list[float]:
    """Position weights from hop depths.

    Args:
        hops: the hop of each gold position (>= 1).
        weighting: ``linear`` (``w = hop``), ``power`` (``hop ** p``), ``affine`` (``1 + alpha * (hop - 1)``)
            or ``uniform`` (``w = 1``, which makes the reward micro accuracy).
        p: exponent of ``power``.
        alpha: slope of ``affine``.

    Returns:
        One weight per position.

    Raises:
        ValueError: on an unknown weighting, a weighting that falls with hop (see
            :func:`validate_hop_weighting`) or a hop below 1.

    >>> hop_weights([1, 2, 4]), hop_weights([1, 2, 4], "power", p=2), hop_weights([1, 3], "affine", alpha=0.5)
    ([1.0, 2.0, 4.0], [1.0, 4.0, 16.0], [1.0, 2.0])
    """
    validate_hop_weighting(weighting, p, alpha)
    if any(h < 1 for h in hops):
        raise ValueError(f"answer_hops must all be >= 1, got {list(hops)}")
    if weighting == "linear":
        return [float(h) for h in hops]
    if weighting == "power":
        return [float(h) ** p for h in hops]
    if weighting == "affine":
        return [1.0 + alpha * (h - 1) for h in hops]
    if weighting == "uniform":
        return [1.0] * len(hops)
    raise ValueError(f"weighting must be one of linear, power, affine, uniform; got {weighting!r}")


def get_hop_weighted_reward(
    weighting: Weighting = "linear", p: float = 1.0, alpha: float = 1.0
) -> Callable[..., list[float | None]]:
    """A hop-weighted reward ``r = Σ w_i·1[pred_i == gold_i] / Σ w_i`` with the given weights.

    Args:
        weighting: see :func:`hop_weights`.
        p: exponent of ``power``.
        alpha: slope of ``affine``.

    Returns:
        ``reward(completions, answer, answer_hops, **kwargs) -> list[float | None]``; 0 for a completion
        without ``<answer>``, ``None`` where ``answer`` is ``None``.

    Raises:
        ValueError: on an unknown weighting or one that falls with hop (at once, not at the first call).

    >>> reward = get_hop_weighted_reward("power", p=2)
    >>> reward(["<answer>5 9</answer>"], answer=[["5", "7"]], answer_hops=[[1, 2]])
    [0.2]
    """
    validate_hop_weighting(weighting, p, alpha)  # fail when the reward (or its config) is built

    def reward(completions: list, answer: list, answer_hops: list, **kwargs) -> list[float | None]:
        out: list[float | None] = []
        for completion, gold, hops in zip(completions, answer, answer_hops, strict=True):
            if gold is None:
                out.append(None)
                continue
            gold = _gold(gold)
            if len(hops) != len(gold):
                raise ValueError(f"answer has {len(gold)} tokens but answer_hops has {len(hops)}; they must align")
            pred = extract_answer(completion_text(completion))
            if pred is None:
                out.append(0.0)
                continue
            weights = hop_weights(hops, weighting, p, alpha)
            hits = position_matches(pred, gold)
            out.append(math.fsum(w for w, ok in zip(weights, hits) if ok) / math.fsum(weights))
        return out

    reward.__name__ = f"hop_weighted_reward_{weighting}"
    return reward


_linear = get_hop_weighted_reward("linear")


def hop_weighted_reward(completions: list, answer: list, answer_hops: list, **kwargs) -> list[float | None]:
    """The default hop-weighted reward, ``w = hop``.

    Args:
        completions: model completions (strings or conversational message lists).
        answer: per sample, the gold tokens (list or space-separated string), or ``None`` to skip.
        answer_hops: per sample, the hop of each gold token.
        **kwargs: other dataset columns, ignored.

    Returns:
        One reward in [0, 1] per completion (0 without ``<answer>``), ``None`` for skipped samples.

    >>> hop_weighted_reward(
    ...     ["<answer>5 7 3</answer>", "<answer>5 0 3</answer>", "no tags: 5 7 3", [{"role": "assistant", "content": "<answer>5</answer>"}]],
    ...     answer=["5 7 3"] * 4,
    ...     answer_hops=[[1, 2, 3]] * 4,
    ... )
    [1.0, 0.6666666666666666, 0.0, 0.16666666666666666]
    """
    return _linear(completions, answer, answer_hops, **kwargs)


def micro_accuracy_reward(completions: list, answer: list, **kwargs) -> list[float | None]:
    """Fraction of gold positions matched (micro accuracy of one puzzle); 0 without ``<answer>``.

    Args:
        completions: model completions (strings or conversational message lists).
        answer: per sample, the gold tokens (list or space-separated string), or ``None`` to skip.
        **kwargs: other dataset columns, ignored.

    Returns:
        One reward in [0, 1] per completion, ``None`` for skipped samples.

    >>> micro_accuracy_reward(["<answer>5 7 12.0</answer>", "<answer>5 7 12 4</answer>", "5 7 12"], answer=[["5", "7", "12"]] * 3)
    [0.6666666666666666, 1.0, 0.0]
    """
    out: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        if gold is None:
            out.append(None)
            continue
        gold = _gold(gold)
        hits = position_matches(extract_answer(completion_text(completion)), gold)
        out.append(sum(hits) / len(gold))
    return out


def format_reward(completions: list, answer: list | None = None, **kwargs) -> list[float | None]:
    """1.0 if the completion ends in a well-formed answer, else 0.0.

    Well formed: an ``<answer>…</answer>`` whose tokens are all non-negative integers, with nothing
    but whitespace after the closing tag, and (when ``answer`` is given) as many tokens as blanks.

    Args:
        completions: model completions (strings or conversational message lists).
        answer: optional per-sample gold tokens, to check the token count.
        **kwargs: other dataset columns, ignored.

    Returns:
        One of 0.0 / 1.0 per completion.

    >>> format_reward(["work <answer>3 14</answer>", "<answer>3 x</answer>", "<answer>3</answer> more", "3 14"])
    [1.0, 0.0, 0.0, 0.0]
    >>> format_reward(["<answer>3 14</answer>"], answer=[["3", "14", "1"]])
    [0.0]
    """
    golds = answer if answer is not None else [None] * len(completions)
    out: list[float | None] = []
    for completion, gold in zip(completions, golds, strict=True):
        text = completion_text(completion)
        pred = extract_answer(text)
        ok = (
            pred is not None
            and len(pred) > 0
            and all(token.isascii() and token.isdigit() for token in pred)
            and text.lower().rstrip().endswith("</answer>")
            and (gold is None or len(pred) == len(_gold(gold)))
        )
        out.append(1.0 if ok else 0.0)
    return out


REWARDS: dict[str, Callable[..., list[float | None]]] = {
    "hop_weighted": hop_weighted_reward,
    "micro_accuracy": micro_accuracy_reward,
    "format": format_reward,
}
"""Rewards by the name a GRPO config uses; parameterised variants come from :func:`get_hop_weighted_reward`."""
