"""Collation in data-loader worker processes keeps every recipe's bookkeeping (issue 21, item 1).

With ``train.dataloader_num_workers > 0`` the collator runs in the workers: its swap stats, sample-id log and
resume state must still reach the main process, hold exactly the batches that trained, and equal a run with
0 workers, across a resume too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tokenswap.config import load_config

# Every test here starts a process, a server or a training run (make check skips them).
pytestmark = pytest.mark.integration

ASSETS = Path(__file__).resolve().parents[1] / "assets"
WORKERS = "train.dataloader_num_workers=2"


def overrides(out, model, store, *extra):
    return [f"run.output_dir={out}", f"model.name_or_path={model}", f"data.swap_dataset={ASSETS / 'swap_tiny.jsonl'}",
            f"image_store={store}", "gap_eval.bench=null", *extra]


def post_overrides(out, model, store, *extra):
    return overrides(out, model, store, f"data.llava_json={ASSETS / 'llava_tiny.json'}",
                     f"data.llava_image_root={ASSETS / 'images'}", *extra)


def losses(out: Path) -> list[float]:
    return [h["loss"] for h in json.loads((out / "log_history.json").read_text()) if "loss" in h]


def data_stats(out: Path) -> dict:
    """swap_stats.json without the pixel-cache counter, which depends on what each process had cached."""
    return {k: v for k, v in json.loads((out / "swap_stats.json").read_text()).items() if k != "image_decodes"}


def log_lines(out: Path) -> list[str]:
    return (out / "sample_ids.rank0.txt").read_text().splitlines()


def checkpoint_state(out: Path, step: int) -> dict:
    """The collator state a checkpoint resumes from, without the pixel-cache counter (it depends on the process)."""
    state = json.loads((out / f"checkpoint-{step}" / "tokenswap_state.rank0.json").read_text())
    collator = state["collator"]
    assert collator is not None, f"checkpoint-{step} holds no collator state"
    return {"log_bytes": collator["log_bytes"], "stats": {k: v for k, v in collator["stats"].items() if k != "image_decodes"}}


def assert_same_bookkeeping(got: Path, want: Path, stats=data_stats, steps=(2, 4)) -> None:
    torch.testing.assert_close(torch.tensor(losses(got)), torch.tensor(losses(want)), rtol=1e-5, atol=1e-5)
    assert log_lines(got) == log_lines(want)
    assert stats(got) == stats(want)
    for step in steps:
        assert checkpoint_state(got, step) == checkpoint_state(want, step)


@pytest.fixture(scope="module")
def post(load_recipe):
    return load_recipe("post_train")


def test_post_train_with_workers_keeps_stats_ids_and_resume_state(post, tiny_qwen2vl, tiny_store, tmp_path):
    def run(out: Path, *extra: str) -> None:
        overrides = post_overrides(out, tiny_qwen2vl, tiny_store.root, *extra)
        post.main(load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml", overrides))

    run(zero := tmp_path / "workers0")
    assert len(log_lines(zero)) == 4 and len(data_stats(zero)) > 5  # one line per trained batch
    run(two := tmp_path / "workers2", WORKERS)
    assert_same_bookkeeping(two, zero)
    # Interrupted after checkpoint-2 (the workers had collated batches 3 and 4 ahead), then resumed.
    run(resumed := tmp_path / "resumed", WORKERS, "train.max_steps=2")
    assert log_lines(resumed) == log_lines(zero)[:2]
    run(resumed, WORKERS, "train.resume_from_checkpoint=latest")
    assert_same_bookkeeping(resumed, zero)


def test_post_train_with_workers_and_gradient_accumulation(post, tiny_qwen2vl, tiny_store, tmp_path):
    """The Trainer fetches a whole accumulation window ahead; the logs still follow the micro-batches trained."""
    def run(out: Path, *extra: str) -> None:
        overrides = post_overrides(out, tiny_qwen2vl, tiny_store.root, "train.gradient_accumulation_steps=2",
                                   "train.per_device_train_batch_size=2", "train.max_steps=2", "train.save_steps=1",
                                   *extra)
        post.main(load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml", overrides))

    run(zero := tmp_path / "workers0")
    assert len(log_lines(zero)) == 4
    run(two := tmp_path / "workers2", WORKERS)
    assert_same_bookkeeping(two, zero, steps=(1, 2))


def test_pretrain_with_workers_keeps_stats_and_ids(load_recipe, tiny_qwen2vl, tiny_store, tmp_path):
    pre = load_recipe("pretrain")
    outs = {}
    for workers in (0, 2):
        out = outs[workers] = tmp_path / f"workers{workers}"
        pre.main(load_config(pre.PretrainConfig, "tiny/pretrain_tokenswap.yaml", overrides(
            out, tiny_qwen2vl, tiny_store.root, "train.max_steps=2", "train.save_steps=2",
            f"train.dataloader_num_workers={workers}")))
    assert len(log_lines(outs[0])) == 2
    assert_same_bookkeeping(outs[2], outs[0], steps=(2,))


@pytest.mark.parametrize("packing", [False, True], ids=["padded", "packed"])
def test_image_sft_with_workers_keeps_stats_and_ids(load_recipe, tiny_qwen2vl, tmp_path, packing):
    image_sft = load_recipe("image_sft")

    def collator_stats(out: Path) -> dict:
        stats = json.loads((out / "collator_stats.json").read_text())
        return {k: v for k, v in stats.items() if k != "image_decodes"}

    outs = {}
    for workers in (0, 2):
        out = outs[workers] = tmp_path / f"workers{workers}"
        extra = ["collator.packing=true", "collator.pack_budget=8192"] if packing else []
        image_sft.main(load_config(image_sft.ImageSFTConfig, "tiny/image_sft_crossmath.yaml", [
            f"run.output_dir={out}", f"model.name_or_path={tiny_qwen2vl}", "eval=null", "train.save_steps=2",
            f"train.dataloader_num_workers={workers}", *extra]))
    assert len(log_lines(outs[0])) == 3  # 3 steps of one micro-batch (one packed row each when packed)
    assert_same_bookkeeping(outs[2], outs[0], stats=collator_stats, steps=(2,))
