"""`run.seed` is the replicate: it seeds the data order, the swap decisions and the init together, unless
`data.seed` / `collator.swap_seed` are set; the arms of one replicate stay paired."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from tokenswap.config import load_config
from tokenswap.swap import SwapPolicy

ASSETS = Path(__file__).resolve().parents[2] / "tests" / "assets"


def _overrides(out, model, store, *extra):
    return [f"run.output_dir={out}", f"model.name_or_path={model}", f"data.swap_dataset={ASSETS / 'swap_tiny.jsonl'}",
            f"data.llava_json={ASSETS / 'llava_tiny.json'}", f"data.llava_image_root={ASSETS / 'images'}",
            "gap_eval.bench=null", *([f"image_store={store}"] if store else []), *extra]


def _ids(out: Path) -> list[str]:
    return (out / "sample_ids.rank0.txt").read_text().split()


def _losses(out: Path) -> list[float]:
    return [h["loss"] for h in json.loads((out / "log_history.json").read_text()) if "loss" in h]


@pytest.fixture(scope="module")
def post(load_recipe):
    return load_recipe("post_train")


def test_run_seed_sets_order_and_swaps_unless_they_are_set(post, tmp_path):
    def cfg(*extra):
        return load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml",
                           _overrides(tmp_path, "m", "s", *extra))

    def decisions(c):
        policy = SwapPolicy(swap_prob=0.5, seed=c.collator.swap_seed)
        return [policy.decide(f"mp-{i}", [SimpleNamespace(message=0)] * 8, ["user"]) for i in range(16)]

    one, two = cfg("run.seed=1"), cfg("run.seed=2")
    assert (one.data.seed, one.collator.swap_seed) == (1, 1)
    assert decisions(one) != decisions(two)  # another replicate, other swap decisions
    fixed = cfg("run.seed=2", "data.seed=7", "collator.swap_seed=1")  # set explicitly: held across replicates
    assert (fixed.data.seed, fixed.collator.swap_seed) == (7, 1)
    assert decisions(fixed) == decisions(one)


@pytest.mark.integration
def test_two_replicates_differ_and_the_arms_of_one_stay_paired(post, tiny_qwen2vl, tiny_store, tmp_path):
    outs = {}
    for arm, seed in (("tokenswap", 0), ("tokenswap", 1), ("text", 1)):
        out = tmp_path / f"{arm}-s{seed}"
        store = tiny_store.root if arm == "tokenswap" else None
        post.main(load_config(post.PostTrainConfig, f"tiny/post_{arm}.yaml",
                              _overrides(out, tiny_qwen2vl, store, f"run.seed={seed}")))
        outs[arm, seed] = out
    assert _ids(outs["tokenswap", 0]) != _ids(outs["tokenswap", 1])  # another order ...
    assert _losses(outs["tokenswap", 0]) != _losses(outs["tokenswap", 1])  # ... so another loss curve
    assert _ids(outs["text", 1]) == _ids(outs["tokenswap", 1])  # one replicate, one order for both arms
    saved = json.loads((outs["tokenswap", 1] / "tokenswap_config.json").read_text())
    assert (saved["data"]["seed"], saved["collator"]["swap_seed"]) == (1, 1)  # the resolved seeds are on record
