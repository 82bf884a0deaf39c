"""Post-training with packing, length grouping and the throughput readout, through the recipe's real entry point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tokenswap.config import load_config

# Every test here starts a process, a server or a training run (make check skips them).
pytestmark = pytest.mark.integration

ASSETS = Path(__file__).resolve().parents[2] / "tests" / "assets"


def post_overrides(out, model, store, *extra):
    return [f"run.output_dir={out}", f"model.name_or_path={model}", f"data.swap_dataset={ASSETS / 'swap_tiny.jsonl'}",
            f"data.llava_json={ASSETS / 'llava_tiny.json'}", f"data.llava_image_root={ASSETS / 'images'}",
            *([f"image_store={store}"] if store else []), "gap_eval.bench=null", *extra]


@pytest.fixture(scope="module")
def post(load_recipe):
    return load_recipe("post_train")


def history(out: Path) -> list[dict]:
    return [h for h in json.loads((out / "log_history.json").read_text()) if "loss" in h]


def test_packed_post_training_logs_perf_and_pack_ids(post, tiny_qwen2vl, tiny_store, tmp_path):
    outs = {}
    for packing in (False, True):
        out = tmp_path / f"packing-{packing}"
        cfg = load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml",
                          post_overrides(out, tiny_qwen2vl, tiny_store.root, f"collator.packing={str(packing).lower()}",
                                         "collator.pack_budget=4096", "throughput.peak_tflops=1.0"))
        post.main(cfg)
        outs[packing] = out
    padded, packed = history(outs[False]), history(outs[True])
    assert len(packed) == len(padded) == 4
    for h in packed:
        assert torch.isfinite(torch.tensor(h["loss"]))
        assert h["perf/tokens_per_s"] > 0 and h["perf/mfu"] > 0
        assert h["perf/padding"] == 0.0  # each batch of 4 fits one row of 4096 tokens
        assert h["swap/packed_rows"] > 0
    assert all(h["perf/padding"] > 0 for h in padded)
    # Same samples in the same order; the packed log has one line per row (here: per batch).
    ids = {p: (o / "sample_ids.rank0.txt").read_text() for p, o in outs.items()}
    assert ids[True].split() == ids[False].split()
    assert len(ids[True].splitlines()) == 4
    # Same samples per step, per-sample attention: the first step's loss is the same computation.
    torch.testing.assert_close(torch.tensor(packed[0]["loss"]), torch.tensor(padded[0]["loss"]), rtol=1e-4, atol=1e-4)


def test_group_by_length_keeps_the_arms_paired(post, tiny_qwen2vl, tiny_store, tmp_path):
    ids = {}
    for arm in ("text", "tokenswap"):
        out = tmp_path / arm
        store = tiny_store.root if arm == "tokenswap" else None
        cfg = load_config(post.PostTrainConfig, f"tiny/post_{arm}.yaml",
                          post_overrides(out, tiny_qwen2vl, store, "collator.group_by_length=true"))
        post.main(cfg)
        ids[arm] = (out / "sample_ids.rank0.txt").read_text().split()
    assert ids["text"] == ids["tokenswap"]
