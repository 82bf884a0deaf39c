"""The decomposition of a gap: exact points on hand-made items, intervals from one seeded stream, refusals."""

import numpy as np
import pytest

from tokenswap.eval.decompose import decompose, decomposition_markdown
from tokenswap.eval.stats import bootstrap_indices


def _items(rows, recognized=None, sent=None):
    items = []
    for i, (t, x, b) in enumerate(rows):
        r = {"id": f"q{i}", "correct_text": bool(t), "correct_interleaved": bool(x), "correct_both": bool(b),
             "images_sent": 1 if sent is None else sent[i]}
        if recognized is not None:
            r["recognized"] = recognized[i]
        items.append(r)
    return items


def test_split_is_exact_and_adds_up_to_the_gap():
    # Items 0-1 have every picture identified; 2-3 do not.
    items = _items([(1, 0, 1), (1, 1, 1), (1, 0, 1), (1, 0, 1)], recognized=[True, True, False, False])
    d = decompose(items, [{"correct_recognition": v} for v in (True, True, False)], resamples=500)
    assert d["gap"]["value"] == 0.75
    assert d["load"]["value"] == 0.0 and d["content"]["value"] == 0.75
    parts = {k: v["value"] for k, v in d["components"].items()}
    assert parts == {"load": 0.0, "recognition": 0.25, "rest": 0.5}  # rest: content over the recognised items
    assert sum(parts.values()) == d["gap"]["value"]
    assert d["recognised_only"]["n"] == 2 and d["recognised_only"]["gap"]["value"] == 0.5
    assert d["recognition_rate"]["value"] == pytest.approx(2 / 3) and d["recognition_rate"]["n_pictures"] == 3
    assert d["forms"] == ["text", "interleaved", "both", "recognition"]


def test_split_without_both_uses_the_recognised_gap():
    items = [{k: v for k, v in r.items() if k != "correct_both"} for r in
             _items([(1, 0, 1), (1, 1, 1), (1, 0, 1), (1, 0, 1)], recognized=[True, True, False, False])]
    d = decompose(items, resamples=200)
    assert d["load"] is None and d["content"] is None
    assert {k: v["value"] for k, v in d["components"].items()} == {"recognition": 0.25, "rest": 0.5}


def test_split_without_recognition_is_load_and_content():
    d = decompose(_items([(1, 0, 0), (1, 0, 1), (0, 0, 0), (1, 1, 1)]), resamples=200)
    assert d["recognised_only"] is None and d["recognition_rate"] is None
    assert {k: v["value"] for k, v in d["components"].items()} == {"load": 0.25, "rest": 0.25}


def test_no_recognised_item_leaves_the_split_open():
    d = decompose(_items([(1, 0, 1), (1, 0, 0)], recognized=[False, False]), resamples=100)
    assert d["recognised_only"]["n"] == 0 and d["recognised_only"]["gap"]["value"] is None
    assert d["components"]["rest"]["value"] is None and d["components"]["recognition"]["value"] is None
    assert d["components"]["load"]["value"] == 0.5


def test_intervals_are_seeded_paired_and_cover_the_point():
    rng = np.random.default_rng(3)
    rows = [(rng.random() < 0.8, rng.random() < 0.5, rng.random() < 0.7) for _ in range(300)]
    items = _items(rows, sent=[1 + i % 3 for i in range(300)])
    a, b, c = decompose(items, seed=0, resamples=2000), decompose(items, seed=0, resamples=2000), \
        decompose(items, seed=1, resamples=2000)
    assert a == b and a["gap"]["ci"] != c["gap"]["ci"]
    for e in (a["gap"], a["load"], *a["acc"].values()):
        assert e["ci"][0] <= e["value"] <= e["ci"][1]
    # Paired: an item's forms move together, so a gap between two strongly tied forms is narrow.
    tied = _items([(t, t, t) for t, _, _ in rows])
    assert decompose(tied, resamples=500)["gap"]["ci"] == [0.0, 0.0]
    assert sorted(a["by_images_sent"]) == ["1", "2", "3"] and sum(g["n"] for g in a["by_images_sent"].values()) == 300


def test_by_images_sent_interval_does_not_move_when_another_group_changes():
    items = _items([(1, 0, 1), (1, 1, 1), (0, 0, 1), (1, 0, 0)] * 10, sent=[1, 2] * 20)
    d1 = decompose(items, resamples=300)
    d2 = decompose(items + _items([(1, 1, 1)], sent=[2]), resamples=300)
    assert d1["by_images_sent"]["1"] == d2["by_images_sent"]["1"]
    assert d1["by_images_sent"]["2"] != d2["by_images_sent"]["2"]


def test_the_leaderboard_stream_is_the_same():
    # tokenswap leaderboard's paired bootstrap draws (chunk, n) blocks from default_rng(seed): one stream.
    rng = np.random.default_rng(5)
    first = next(bootstrap_indices(7, 10, 5))
    assert (first == rng.integers(0, 7, size=(10, 7))).all()


@pytest.mark.parametrize(
    "items, message",
    [
        ([], "at least one item"),
        ([{"correct_text": True}], "correct_interleaved"),
        ([{"correct_text": True, "correct_interleaved": None, "images_sent": 1}], "not true/false"),
        ([{"correct_text": True, "correct_interleaved": True, "correct_both": True, "images_sent": 1},
          {"correct_text": True, "correct_interleaved": True, "images_sent": 1}], "some items only"),
        ([{"correct_text": True, "correct_interleaved": True, "images_sent": 1, "recognized": "yes"}], "recognized"),
        ([{"correct_text": True, "correct_interleaved": True, "images_sent": "2"}], "images_sent"),
    ],
)
def test_refuses_records_it_cannot_score(items, message):
    with pytest.raises(ValueError, match=message):
        decompose(items, resamples=10)


def test_markdown_names_every_part():
    items = _items([(1, 0, 1), (1, 1, 1), (1, 0, 1), (1, 0, 1)], recognized=[True, True, False, False])
    text = decomposition_markdown(decompose(items, [{"correct_recognition": True}], resamples=100))
    for needle in ("| text | 4 | 100.0", "load = text − both | 4 | +0.0", "recognised-only items | 2 | +50.0",
                   "recognition +25.0", "rest +50.0", "| 1 | 4 | +75.0"):
        assert needle in text, needle
