"""Every supported family through the real recipe entry points: the right model class, the in-loop gap evaluator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from tokenswap.config import load_config
from tokenswap.testing import TINY_FAMILIES

# Every test here starts a process, a server or a training run (make check skips them).
pytestmark = pytest.mark.integration

ASSETS = Path(__file__).resolve().parents[1] / "assets"


@pytest.mark.parametrize("family", TINY_FAMILIES)
def test_post_training_runs_with_the_in_loop_gap_evaluator(family, load_recipe, tiny_family, tiny_store, tiny_bench,
                                                            tmp_path):
    post = load_recipe("post_train")
    model_dir = tiny_family(family)
    out = tmp_path / family
    cfg = load_config(post.PostTrainConfig, "tiny/post_tokenswap.yaml", [
        f"run.output_dir={out}", f"model.name_or_path={model_dir}",
        f"data.swap_dataset={ASSETS / 'swap_tiny.jsonl'}", f"data.llava_json={ASSETS / 'llava_tiny.json'}",
        f"data.llava_image_root={ASSETS / 'images'}", f"image_store={tiny_store.root}",
        "train.max_steps=2", "train.save_steps=2", f"gap_eval.bench={tiny_bench}", "gap_eval.every_steps=2",
        "model.min_pixels=3136", "model.max_pixels=50176",
    ])
    post.main(cfg)

    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == family
    history = json.loads((out / "log_history.json").read_text())
    trace = [h["loss"] for h in history if "loss" in h]
    assert len(trace) == 2 and all(torch.isfinite(torch.tensor(trace)))
    gaps = [h for h in history if any(k.startswith("gap/") for k in h)]
    assert gaps, f"{family}: the in-loop gap evaluator logged nothing"
    assert json.loads((out / "swap_stats.json").read_text())["concepts_swapped"] > 0
    before, after = load_file(model_dir / "model.safetensors"), load_file(out / "model.safetensors")
    assert any(not torch.equal(before[k], after[k]) for k in before if k in after)


def test_crossmath_sft_then_grpo_on_qwen3_5(load_recipe, tiny_family, tmp_path):
    """The CrossMath configs default to Qwen3.5-9B: its tiny twin goes through image-only SFT and then GRPO."""
    image_sft, grpo = load_recipe("image_sft"), load_recipe("grpo")
    sft_out = tmp_path / "sft"
    image_sft.main(load_config(image_sft.ImageSFTConfig, "tiny/image_sft_crossmath.yaml", [
        f"run.output_dir={sft_out}", f"model.name_or_path={tiny_family('qwen3_5')}", "train.max_steps=2",
        "eval=null",
    ]))
    assert json.loads((sft_out / "config.json").read_text())["model_type"] == "qwen3_5"
    rl_out = tmp_path / "grpo"
    grpo.main(load_config(grpo.GRPORecipeConfig, "tiny/grpo_crossmath.yaml", [
        f"run.output_dir={rl_out}", f"model.name_or_path={sft_out}", "train.max_steps=1",
    ]))
    losses = [h["loss"] for h in json.loads((rl_out / "log_history.json").read_text()) if "loss" in h]
    assert len(losses) == 1 and all(torch.isfinite(torch.tensor(losses)))
    assert json.loads((rl_out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(sft_out)
