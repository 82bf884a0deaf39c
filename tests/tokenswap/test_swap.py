"""SwapPolicy: pure, seeded decisions (across processes, epochs, limits); interleave() edge cases."""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter

import pytest

from tokenswap.concepts import Concept
from tokenswap.swap import SwapPolicy, interleave, unit_hash


def concepts(n: int, message: int = 0) -> list[Concept]:
    return [Concept(message, 10 * k, 10 * k + 5, f"c{k}") for k in range(n)]


USER_ONLY = ["user", "assistant"]
SAMPLE_IDS = [f"s{i}" for i in range(200)]


def decisions(policy: SwapPolicy, n: int = 6, epoch: int = 0) -> dict[str, list[bool]]:
    return {sid: policy.decide(sid, concepts(n), USER_ONLY, epoch) for sid in SAMPLE_IDS}


# ---------------------------------------------------------------------------- purity
@pytest.mark.integration
def test_decisions_are_identical_in_a_fresh_process():
    # A new interpreter has a different hash seed (PYTHONHASHSEED) and RNG state: only a pure
    # function of (seed, id, k, epoch) gives the same answer.
    policy = SwapPolicy(swap_prob=0.5, max_images=3, seed=7)
    here = {sid: [policy.decide(sid, concepts(6), USER_ONLY), policy.pick(sid, 2, 5)] for sid in SAMPLE_IDS[:50]}
    code = (
        "import json, random; random.seed(123)\n"
        "from tokenswap.concepts import Concept\n"
        "from tokenswap.swap import SwapPolicy\n"
        "p = SwapPolicy(swap_prob=0.5, max_images=3, seed=7)\n"
        "cs = [Concept(0, 10 * k, 10 * k + 5, f'c{k}') for k in range(6)]\n"
        "print(json.dumps({f's{i}': [p.decide(f's{i}', cs, ['user', 'assistant']), p.pick(f's{i}', 2, 5)]"
        " for i in range(50)}))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "999"}
    )
    assert json.loads(out.stdout) == here


def test_repeated_calls_agree_and_seed_changes_decisions():
    p = SwapPolicy(swap_prob=0.5)
    assert decisions(p) == decisions(p)
    assert decisions(p) != decisions(SwapPolicy(swap_prob=0.5, seed=1))


def test_unit_hash_is_in_unit_interval_and_depends_on_every_part():
    values = [unit_hash(0, f"s{i}", 3, 0) for i in range(1000)]
    assert all(0.0 <= v < 1.0 for v in values)
    base = unit_hash(0, "s", 1, 0)
    assert len({base, unit_hash(1, "s", 1, 0), unit_hash(0, "t", 1, 0), unit_hash(0, "s", 2, 0)}) == 4


# ---------------------------------------------------------------------------- swap_prob
def test_swap_prob_extremes():
    assert all(all(d) for d in decisions(SwapPolicy(swap_prob=1.0)).values())
    assert not any(any(d) for d in decisions(SwapPolicy(swap_prob=0.0)).values())


@pytest.mark.parametrize("prob", [0.1, 0.3, 0.7])
def test_empirical_swap_rate_matches_swap_prob(prob):
    flags = [f for d in decisions(SwapPolicy(swap_prob=prob), n=20).values() for f in d]
    # 4000 Bernoulli draws: the standard deviation of the rate is <= 0.008; 0.03 is ~4 sigma.
    assert abs(sum(flags) / len(flags) - prob) < 0.03


@pytest.mark.parametrize("prob", [-0.1, 1.5])
def test_swap_prob_out_of_range_names_the_value(prob):
    with pytest.raises(ValueError, match=rf"swap_prob must be in \[0, 1\], got {prob}"):
        SwapPolicy(swap_prob=prob)


# ---------------------------------------------------------------------------- max_images
def test_max_images_keeps_the_smallest_hashes_deterministically():
    policy = SwapPolicy(swap_prob=0.8, max_images=2, seed=3)
    unlimited = SwapPolicy(swap_prob=0.8, seed=3)
    for sid in SAMPLE_IDS[:50]:
        chosen = policy.decide(sid, concepts(8), USER_ONLY)
        assert chosen == policy.decide(sid, concepts(8), USER_ONLY)
        eligible = [k for k, f in enumerate(unlimited.decide(sid, concepts(8), USER_ONLY)) if f]
        expected = sorted(eligible, key=lambda k: unit_hash(3, sid, k, 0, "swap"))[:2]
        assert [k for k, f in enumerate(chosen) if f] == sorted(expected)
        # The limit only removes swaps: a kept one was eligible without it.
        assert set(expected) <= set(eligible)


def test_max_images_zero_swaps_nothing_and_negative_is_rejected():
    assert not any(any(d) for d in decisions(SwapPolicy(max_images=0)).values())
    with pytest.raises(ValueError, match="max_images must be >= 0"):
        SwapPolicy(max_images=-1)


# ---------------------------------------------------------------------------- roles
def test_only_concepts_in_allowed_roles_are_swapped():
    mixed = [Concept(0, 0, 3, "a"), Concept(1, 0, 3, "b"), Concept(2, 0, 3, "c"), Concept(3, 0, 3, "d")]
    roles = ["system", "user", "assistant", "user"]
    assert SwapPolicy().decide("s", mixed, roles) == [False, True, False, True]
    assert SwapPolicy(roles=("assistant", "system")).decide("s", mixed, roles) == [True, False, True, False]
    assert SwapPolicy(roles=["user"]).roles == ("user",)  # lists from YAML become hashable tuples


# ---------------------------------------------------------------------------- epochs
def test_epoch_is_ignored_unless_resample_each_epoch():
    static = SwapPolicy(swap_prob=0.5)
    assert decisions(static, epoch=0) == decisions(static, epoch=3)
    assert [static.pick(s, 0, 4, epoch=0) for s in SAMPLE_IDS] == [static.pick(s, 0, 4, epoch=5) for s in SAMPLE_IDS]

    dynamic = SwapPolicy(swap_prob=0.5, resample_each_epoch=True)
    assert decisions(dynamic, epoch=0) == decisions(static, epoch=0)  # epoch 0 is the static draw
    assert decisions(dynamic, epoch=1) != decisions(dynamic, epoch=0)
    assert decisions(dynamic, epoch=1) == decisions(dynamic, epoch=1)
    assert [dynamic.pick(s, 0, 4, epoch=0) for s in SAMPLE_IDS] != [dynamic.pick(s, 0, 4, epoch=1) for s in SAMPLE_IDS]


# ---------------------------------------------------------------------------- pick
def test_pick_is_in_range_and_roughly_uniform():
    policy = SwapPolicy()
    counts = Counter(policy.pick(f"s{i}", k, 5) for i in range(400) for k in range(5))
    assert set(counts) == set(range(5))
    # 2000 draws over 5 bins: expected 400 each, sd 18; 80 is > 4 sigma.
    assert all(abs(c - 400) < 80 for c in counts.values()), counts
    assert all(policy.pick(f"s{i}", 0, 1) == 0 for i in range(50))


def test_pick_needs_a_candidate():
    with pytest.raises(ValueError, match="at least one candidate"):
        SwapPolicy().pick("s", 0, 0)


# ---------------------------------------------------------------------------- interleave
def text_of(parts: list[dict]) -> str:
    return "".join(p["text"] if p["type"] == "text" else f"[{p['image']}]" for p in parts)


@pytest.mark.parametrize(
    "text, spans, expected",
    [
        ("cat sat", [(0, 3, "A")], "[A] sat"),  # span at the start: no empty text part
        ("a cat", [(2, 5, "A")], "a [A]"),  # span at the end
        ("applebanana", [(0, 5, "A"), (5, 11, "B")], "[A][B]"),  # adjacent spans, whole text
        ("  x  ", [(2, 3, "A")], "  [A]  "),  # surrounding whitespace kept byte for byte
        ("no spans", [], "no spans"),
        ("", [], ""),
    ],
)
def test_interleave_edge_cases(text, spans, expected):
    parts = interleave(text, spans)
    assert text_of(parts) == expected
    assert all(p["text"] for p in parts if p["type"] == "text")  # empty text parts are omitted
    assert [p["image"] for p in parts if p["type"] == "image"] == [s[2] for s in spans]


def test_interleave_adjacent_spans_give_two_image_parts():
    assert interleave("ab", [(0, 1, "A"), (1, 2, "B")]) == [{"type": "image", "image": "A"}, {"type": "image", "image": "B"}]


@pytest.mark.parametrize("spans", [[(4, 6, "B"), (0, 2, "A")], [(0, 4, "A"), (2, 6, "B")]])
def test_interleave_rejects_unsorted_or_overlapping_spans(spans):
    with pytest.raises(ValueError, match="sorted and disjoint"):
        interleave("abcdefgh", spans)
