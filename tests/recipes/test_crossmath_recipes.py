"""Run the CrossMath recipes (image-only SFT, then GRPO from its output) on CPU with the tiny model."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from PIL import Image
from safetensors.torch import load_file

from tokenswap.config import ConfigError, load_config
from tokenswap.crossmath import gold_answer, gold_hops, load_crossmath
from tokenswap.crossmath.rewards import completion_text
from tokenswap.crossmath.training_data import load_training_records, sft_example
from tokenswap.packing import group_by_length, text_lengths
from tokenswap.training import run_recipe


def log_history(out: Path) -> list[dict]:
    return json.loads((out / "log_history.json").read_text())


def lora_b(folder: Path) -> dict[str, torch.Tensor]:
    weights = load_file(folder / "adapter_model.safetensors")
    return {k: v for k, v in weights.items() if "lora_B" in k}


@pytest.fixture(scope="module")
def image_sft(load_recipe):
    return load_recipe("image_sft")


@pytest.fixture(scope="module")
def grpo(load_recipe):
    return load_recipe("grpo")


@pytest.fixture(scope="module")
def sft_out(image_sft, tiny_qwen2vl, tmp_path_factory):
    """One tiny image-only SFT run (3 steps, LoRA merged, held-out eval), shared by the SFT and GRPO tests."""
    out = tmp_path_factory.mktemp("image_sft")
    cfg = load_config(
        image_sft.ImageSFTConfig,
        "tiny/image_sft_crossmath.yaml",
        [f"run.output_dir={out}", f"model.name_or_path={tiny_qwen2vl}"],
    )
    image_sft.main(cfg)
    return out


def test_real_crossmath_configs_validate(image_sft, grpo):
    sft = load_config(image_sft.ImageSFTConfig, "image_sft_crossmath.yaml")
    assert sft.model.lora.r == 16 and sft.train.learning_rate == 2e-5 and sft.collator.max_length == 5000
    assert sft.train.gradient_accumulation_steps == 8 and sft.train.num_train_epochs == 2
    assert sft.model.name_or_path == "Qwen/Qwen3.5-9B" and sft.train.lr_scheduler_type == "cosine"
    assert sft.train.warmup_steps == 0.03
    rl = load_config(grpo.GRPORecipeConfig, "grpo_crossmath.yaml")
    assert rl.model.name_or_path == sft.run.output_dir  # GRPO starts from the SFT output
    assert (rl.train.num_generations, rl.train.max_completion_length, rl.train.max_steps) == (4, 6000, 200)
    assert rl.train.use_vllm is False
    assert rl.model.lora.r == 16 and rl.train.learning_rate == 1e-6 and rl.reward.name == "hop_weighted"
    with pytest.raises(ValueError, match="run.arm: text"):
        load_config(grpo.GRPORecipeConfig, "grpo_crossmath.yaml", ["run.arm=tokenswap"])
    with pytest.raises(ValueError, match="reward.weighting"):
        load_config(grpo.GRPORecipeConfig, "grpo_crossmath.yaml", ["reward.weighting=cubic"])


@pytest.mark.integration
def test_image_sft_trains_merges_saves_and_evaluates(sft_out, tiny_qwen2vl):
    losses = [h["loss"] for h in log_history(sft_out) if "loss" in h]
    assert len(losses) == 3 and all(math.isfinite(x) for x in losses)
    assert losses[-1] < losses[0]
    # LoRA B starts at zero: non-zero B means the adapter was trained.
    assert all(b.abs().max() > 0 for b in lora_b(sft_out / "adapter").values())
    stats = json.loads((sft_out / "collator_stats.json").read_text())
    # Every sample carried its puzzle and nothing was cut (the loader may collate one batch ahead: >= 3 x 2).
    assert stats["images"] == stats["samples"] >= 6 and stats.get("samples_truncated", 0) == 0

    from transformers import AutoModelForImageTextToText, AutoProcessor

    merged = AutoModelForImageTextToText.from_pretrained(sft_out)
    base = AutoModelForImageTextToText.from_pretrained(tiny_qwen2vl)
    AutoProcessor.from_pretrained(sft_out)
    name = next(n for n, _ in merged.named_parameters() if "language_model" in n and n.endswith("q_proj.weight"))
    assert not torch.equal(merged.get_parameter(name), base.get_parameter(name))
    vision = next(n for n, _ in merged.named_parameters() if "visual.blocks" in n)
    assert torch.equal(merged.get_parameter(vision), base.get_parameter(vision))  # LoRA covers the LLM only

    report = json.loads((sft_out / "eval" / "metrics_image.json").read_text())
    assert report["modality"] == "image" and report["n"] == 4 and report["model"] == str(sft_out)
    heldout = {r["markdown_table"] for r in load_crossmath(sft_out / "eval_data" / "Original")}
    train = {r["markdown_table"] for r in load_crossmath(sft_out / "train_data" / "Original")}
    assert heldout and not heldout & train


def one_epoch_config(image_sft, out: Path, model: Path, *overrides: str):
    """The tiny image-SFT config for one whole epoch (every puzzle once), without the held-out eval."""
    return load_config(
        image_sft.ImageSFTConfig,
        "tiny/image_sft_crossmath.yaml",
        [f"run.output_dir={out}", f"model.name_or_path={model}", "train.max_steps=-1", "train.num_train_epochs=1",
         "eval=null", *overrides],
    )


@pytest.mark.integration
def test_image_sft_group_by_length_trains_on_puzzles_grouped_by_length(image_sft, tiny_qwen2vl, tmp_path):
    out = tmp_path / "grouped"
    cfg = one_epoch_config(image_sft, out, tiny_qwen2vl, "collator.group_by_length=true")
    # the section stays as given (the recipe reads the grouped order as is, below, without rewriting its config)
    assert cfg.train.train_sampling_strategy == "random"
    image_sft.main(cfg)
    batches = [line.split() for line in (out / "sample_ids.rank0.txt").read_text().splitlines()]
    logged = [sid for batch in batches for sid in batch]

    # The list the recipe builds, in its ungrouped order (the same data section, generated again elsewhere).
    examples = [sft_example(r) for r in load_training_records(cfg.data, tmp_path / "again")]
    ungrouped = [ex["id"] for ex in examples]
    assert len(ungrouped) == cfg.data.n == 8
    # A permutation of the ungrouped order: no puzzle lost or duplicated, in batches of 2.
    assert [len(b) for b in batches] == [2, 2, 2, 2]
    assert sorted(logged) == sorted(ungrouped) and len(set(logged)) == len(logged)
    # Exactly the grouped order (seeded by data.seed), not the Trainer's shuffle.
    assert logged == [ex["id"] for ex in group_by_length(examples, 2, cfg.data.seed)]

    length = dict(zip(ungrouped, text_lengths(examples)))
    # 8 puzzles are one mega-batch: longest first throughout; the generated order is not already sorted.
    assert [length[i] for i in logged] == sorted(length.values(), reverse=True)
    assert [length[i] for i in ungrouped] != sorted(length.values(), reverse=True)

    def spread(order):  # length differences inside the batches of 2
        return sum(abs(length[a] - length[b]) for a, b in zip(order[::2], order[1::2]))

    # Sorted pairs have the least spread there is; the generated order may already be as good (it is for the
    # 8 puzzles of the release-shaped generator), so only "no worse" holds for any data.
    assert spread(logged) <= spread(ungrouped)


@pytest.mark.integration
def test_image_sft_packed_trains_on_every_puzzle_in_packed_rows(image_sft, tiny_qwen2vl, tmp_path):
    out = tmp_path / "packed"
    cfg = one_epoch_config(image_sft, out, tiny_qwen2vl, "collator.packing=true", "collator.pack_budget=8192",
                           "train.train_sampling_strategy=sequential")
    image_sft.main(cfg)
    losses = [h["loss"] for h in log_history(out) if "loss" in h]
    assert losses and all(math.isfinite(x) for x in losses)
    # Packed: one line per row. A budget that holds a micro-batch of 2 puzzles packs them into one row.
    rows = [line.split() for line in (out / "sample_ids.rank0.txt").read_text().splitlines()]
    examples = [sft_example(r) for r in load_training_records(cfg.data, tmp_path / "again")]
    assert [sid for row in rows for sid in row] == [ex["id"] for ex in examples]  # every puzzle once, in order
    assert [len(row) for row in rows] == [2, 2, 2, 2]
    stats = json.loads((out / "collator_stats.json").read_text())
    assert stats["packed_rows"] >= 4 and stats.get("samples_truncated", 0) == 0
    assert stats["token_slots"] == stats["tokens"]  # no padding at all


@pytest.mark.parametrize(
    "override",
    ["collator.swap_prob=0.5", "collator.max_images=2", "collator.resample_each_epoch=true", "collator.swap_seed=1",
     "collator.prepared=/data/prepared"],
)
def test_image_sft_refuses_swap_only_collator_keys(image_sft, override):
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=rf"`{re.escape(key)}` has no effect in image SFT"):
        load_config(image_sft.ImageSFTConfig, "tiny/image_sft_crossmath.yaml", [override])


@pytest.mark.integration
def test_image_sft_collator_keys_that_apply_still_load(image_sft, capsys):
    applied = ["collator.swap_prob=1.0", "collator.swap_seed=null", "collator.packing=true", "collator.pack_budget=4096",
               "collator.pixel_dtype=bfloat16", "collator.on_bad_image=error", "collator.on_bad_sample=error",
               "collator.max_images_per_sample=2", "collator.max_chars_per_sample=100000",
               "collator.max_image_pixels=1000000", "collator.cache_gb=1.0", "collator.group_by_length=true",
               "train.train_sampling_strategy=sequential"]
    cfg = load_config(image_sft.ImageSFTConfig, "tiny/image_sft_crossmath.yaml", applied)  # defaults set explicitly pass
    assert cfg.collator.packing and cfg.collator.group_by_length
    # Every problem at once, each naming its key, printed as a config error (exit 2) from the command line.
    with pytest.raises(SystemExit) as exit_info:
        run_recipe(image_sft.main, image_sft.ImageSFTConfig, ["--config", "tiny/image_sft_crossmath.yaml",
                                                              "collator.swap_seed=3", "collator.group_by_length=true",
                                                              "train.train_sampling_strategy=group_by_length"])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "`collator.swap_seed` has no effect in image SFT" in err
    assert "`train.train_sampling_strategy: group_by_length` needs tokenized examples" in err


@pytest.mark.parametrize("strategy", ["group_by_length", "batch_rebalance"])
def test_image_sft_refuses_the_trainers_length_samplers(image_sft, strategy):
    # They read `input_ids` from the examples, which the collator only makes per batch: the Trainer would stop
    # at its first step. The config names the collator's grouping instead.
    with pytest.raises(ConfigError, match="set `collator.group_by_length: true`"):
        load_config(image_sft.ImageSFTConfig, "tiny/image_sft_crossmath.yaml",
                    [f"train.train_sampling_strategy={strategy}"])


@pytest.mark.compat
@pytest.mark.integration
def test_grpo_from_sft_checkpoint(grpo, sft_out, tmp_path, monkeypatch):
    calls: list[dict] = []
    real_factory = grpo.get_hop_weighted_reward

    def recording_factory(weighting, p, alpha):
        reward = real_factory(weighting, p, alpha)

        def recorded(completions, answer, answer_hops, **kwargs):
            calls.append({"completions": completions, "answer": answer, "answer_hops": answer_hops, **kwargs})
            scores = reward(completions, answer, answer_hops, **kwargs)
            # A random tiny model never writes <answer>, so every real score is 0 and GRPO's advantages
            # vanish; a tie-breaker gives each group variance so the policy update path is exercised.
            return [s + 0.01 * i for i, s in enumerate(scores)]

        recorded.__name__ = reward.__name__
        return recorded

    monkeypatch.setattr(grpo, "get_hop_weighted_reward", recording_factory)
    out = tmp_path / "grpo"
    cfg = load_config(
        grpo.GRPORecipeConfig,
        "tiny/grpo_crossmath.yaml",
        [f"run.output_dir={out}", f"model.name_or_path={sft_out}"],
    )
    grpo.main(cfg)
    # train: is GRPOConfig itself: the YAML's rollout settings reached TRL
    import torch

    args = torch.load(out / "checkpoint-2" / "training_args.bin", weights_only=False)
    assert type(args).__name__ == "GRPOConfig"
    assert (args.use_vllm, args.num_generations, args.max_completion_length, args.beta) == (False, 4, 16, 0.04)

    # The reward saw the dataset columns, per completion, matching the puzzle each completion answers.
    assert len(calls) == 2
    records = {r["id"]: r for r in load_crossmath(out / "train_data" / "Original")}
    for call in calls:
        assert {"prompts", "completions", "answer", "answer_hops", "image", "id", "difficulty"} <= set(call)
        assert len(call["completions"]) == 4 and len(set(call["id"])) == 1  # one puzzle x 4 rollouts
        record = records[call["id"][0]]
        assert call["answer"][0] == gold_answer(record) and call["answer_hops"][0] == gold_hops(record)
        assert isinstance(completion_text(call["completions"][0]), str)
        with Image.open(record["image_path"]) as image:
            assert call["image"][0].size == image.size

    logs = [h for h in log_history(out) if "loss" in h]
    assert len(logs) == 2 and all(math.isfinite(h["loss"]) for h in logs)
    assert all("rewards/hop_weighted_reward_linear/mean" in h and "rewards/format_reward/mean" in h for h in logs)
    assert all(h["reward_std"] > 0 for h in logs)

    # A fresh adapter on the SFT weights: it moved, and it reloads on top of the SFT checkpoint.
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == str(sft_out)
    assert any(b.abs().max() > 0 for b in lora_b(out).values())
    from peft import PeftModel
    from transformers import AutoModelForImageTextToText, AutoProcessor

    model = PeftModel.from_pretrained(AutoModelForImageTextToText.from_pretrained(sft_out), out)
    assert model.peft_config["default"].r == 16
    AutoProcessor.from_pretrained(out)


@pytest.mark.parametrize(
    "override, match",
    [("train.train_sampling_strategy=group_by_length", r"RepeatSampler .* use `train.shuffle_dataset`"),
     ("train.reward_weights=[1.0,0.5]", r"set `reward.format_weight`")],
)
def test_grpo_refuses_trainer_keys_it_would_ignore(grpo, override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(grpo.GRPORecipeConfig, "tiny/grpo_crossmath.yaml", [override])


@pytest.mark.integration
def test_image_sft_refuses_held_out_puzzles_seen_in_training_before_it_trains(image_sft, tiny_qwen2vl, tmp_path):
    """The overlap is known once both puzzle sets are: it stops the run before the model loads (issue 37), with the
    message it gave after training."""
    out = tmp_path / "overlap"
    cfg = load_config(image_sft.ImageSFTConfig, "tiny/image_sft_crossmath.yaml",
                      [f"run.output_dir={out}", f"model.name_or_path={tiny_qwen2vl}", "eval.data.seed=0"])
    with pytest.raises(ValueError, match=r"eval puzzles \[.+\] are also training puzzles; give eval\.data another seed"):
        image_sft.main(cfg)
    assert (out / "eval_data").is_dir() and (out / "train_data").is_dir()
    assert not list(out.glob("checkpoint-*")) and not (out / "log_history.json").exists()  # nothing was trained
