"""GRPO on image-only CrossMath prompts with the hop-weighted reward, starting from the image-only SFT model
(CrossMath paper §GRPO, SPECS §1.9: 4 rollouts, LoRA r=16, lr 1e-6, 200 steps, max completion 6000).

The reward of a completion is ``Σ w_i·1[pred_i == gold_i] / Σ w_i`` over the blanks, with ``w_i``
growing with the blank's hop depth (``reward.weighting``: linear ``hop``, power ``hop**p``, affine
``1 + alpha·(hop-1)``); optionally plus ``reward.format_weight`` × a well-formed-answer reward.

    # after recipes/image_sft.py wrote outputs/image_sft_crossmath (merged model + processor)
    accelerate launch --config_file configs/accelerate/zero2.yaml recipes/grpo.py --config grpo_crossmath.yaml

    # another weighting, with dotted overrides
    accelerate launch --config_file configs/accelerate/zero2.yaml recipes/grpo.py --config grpo_crossmath.yaml \\
        reward.weighting=power reward.p=2 run.output_dir=outputs/grpo_crossmath_power2

    # tiny CPU run (tests, demo; rollouts use transformers generate, no vLLM); line 1 writes .cache/tiny-qwen2vl
    python -m tokenswap.testing .cache
    python recipes/grpo.py --config tiny/grpo_crossmath.yaml

TRL logs ``rewards/<reward name>/mean`` (e.g. ``rewards/hop_weighted_reward_linear/mean``) every
``train.logging_steps``. With LoRA the reference model of the KL term (``train.beta > 0``) is the
starting model itself, with the adapter disabled.
"""

from __future__ import annotations

import tokenswap.start  # noqa: F401 -- first: a command-line secret refused, the streams redacting before imports print

# ruff: noqa: E402 -- the train extra is checked before the imports that need it
from tokenswap.script import require_extra

require_extra("train", "recipes/grpo.py")  # a package missing: one line naming the extra, exit status 2

# isort: split
import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from tokenswap.crossmath import REWARDS, get_hop_weighted_reward
from tokenswap.crossmath.training_data import CrossMathDataConfig, grpo_dataset, load_training_records
from tokenswap.training.config import ModelConfig, RunConfig, WandbConfig
from tokenswap.training.entry import run_recipe
from tokenswap.training.trainer_args import (
    GRPO_CONFIG,
    TRAIN_DEFAULTS,
    TRAINER_OWNED,
    TRAINING_ARGUMENTS,
    TRL_BASE_CONFIG,
    TrainerSection,
    trainer_section,
)

GRPO_OWNED = {
    **TRAINER_OWNED,
    "reward_weights": "set `reward.format_weight` (the accuracy reward weighs 1)",
    # GRPOTrainer replaces the Trainer's sampler with its RepeatSampler, so any value would be ignored.
    "train_sampling_strategy": "GRPO draws prompts with TRL's RepeatSampler (each prompt `num_generations` "
    "times): use `train.shuffle_dataset` for the order",
}


def grpo_train_section() -> type:
    from trl import GRPOConfig  # transformers, peft and torch with it: built when the config is parsed

    defaults = {**TRAIN_DEFAULTS, "learning_rate": 1e-6, "num_generations": 4, "max_completion_length": 6000}
    return trainer_section(GRPOConfig, "GRPOTrainConfig", owned=GRPO_OWNED, defaults=defaults)


GRPOTrainConfig = TrainerSection(
    "GRPOTrainConfig", grpo_train_section, (GRPO_CONFIG, TRL_BASE_CONFIG, TRAINING_ARGUMENTS), GRPO_OWNED
)
"""Every `GRPOConfig` field (TrainingArguments + rollouts, KL, vLLM, loss type, ...) under `train:`."""


@dataclass(kw_only=True)
class RewardConfig:
    name: Literal["hop_weighted", "micro_accuracy"] = "hop_weighted"
    """Accuracy reward from tokenswap.crossmath.REWARDS; hop_weighted uses `weighting`, `p` and `alpha`."""
    weighting: Literal["linear", "power", "affine", "uniform"] = "linear"
    """Hop weights: linear w=hop, power w=hop**p, affine w=1+alpha*(hop-1), uniform w=1 (= micro accuracy)."""
    p: float = 1.0
    """Exponent of the power weighting."""
    alpha: float = 1.0
    """Slope of the affine weighting."""
    format_weight: float = 0.0
    """Weight of the well-formed-answer reward added to the accuracy reward (0: not used)."""

    def __post_init__(self) -> None:
        if self.format_weight < 0:
            raise ValueError(f"`format_weight` must be >= 0, got {self.format_weight}")
        get_hop_weighted_reward(self.weighting, self.p, self.alpha)  # rejects weights falling with hop, now


@dataclass(kw_only=True)
class GRPORecipeConfig:
    run: RunConfig
    """Output folder and W&B naming; `arm` must be text (no concepts are swapped)."""
    model: ModelConfig
    """The starting checkpoint (the merged image-SFT output) and the new LoRA adapter."""
    data: CrossMathDataConfig = field(default_factory=CrossMathDataConfig)
    """Training puzzles: a `tokenswap crossmath generate` folder, or generated on the fly."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Which reward, and how hops are weighted."""
    train: GRPOTrainConfig = field(default_factory=GRPOTrainConfig)
    """Every `GRPOConfig` field: optimizer, schedule, checkpoints and the rollouts (`num_generations`,
    `max_completion_length`, `temperature`, `top_p`, `beta`, `use_vllm`, ...); per-device batch counts completions."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Run naming: {pair}-{arm}-s{seed} in group {pair}."""

    def __post_init__(self) -> None:
        if self.run.arm != "text":
            raise ValueError(f"CrossMath GRPO swaps no concepts: set `run.arm: text`, got {self.run.arm!r}")


def main(cfg: GRPORecipeConfig) -> None:
    # What trains is imported here, once run_recipe has parsed the config: a typo is answered before torch,
    # transformers and peft load (seconds).
    from transformers import set_seed
    from trl import GRPOTrainer

    from tokenswap.ranks import print0
    from tokenswap.training.checkpoint import CheckpointCallback, train
    from tokenswap.training.model import load_model_and_processor, peft_lora_config
    from tokenswap.training.run import save_final, start_run
    from tokenswap.training.tracking import same_keys_in_wandb

    # ------------------------------------------------------------------ setup (process state before anything else)
    run = start_run(
        cfg,
        stage="grpo",
        reward_weights=[1.0, cfg.reward.format_weight] if cfg.reward.format_weight > 0 else None,
    )

    # ------------------------------------------------------------------ data, rewards
    # Rank 0 generates and renders the puzzles; the other ranks then find them on disk.
    with run.args.main_process_first(desc="crossmath data"):
        records = load_training_records(cfg.data, run.path("train_data"))
    train_dataset = grpo_dataset(records)
    if cfg.reward.name == "hop_weighted":
        accuracy = get_hop_weighted_reward(cfg.reward.weighting, cfg.reward.p, cfg.reward.alpha)
    else:
        accuracy = REWARDS[cfg.reward.name]
    reward_funcs = [accuracy, REWARDS["format"]] if cfg.reward.format_weight > 0 else [accuracy]
    print0(
        f"[grpo] {cfg.run.pair}: {len(train_dataset)} puzzles ({cfg.data.style} style), "
        f"rewards {[f.__name__ for f in reward_funcs]}"
    )

    # ------------------------------------------------------------------ model (after GRPOConfig: ZeRO-3 init)
    # TRL adds the adapter itself (dtype handled for ZeRO-3), and with a fresh adapter the KL reference is
    # the starting model with adapters disabled, instead of a second adapter copied from the first.
    model, processor = load_model_and_processor(dataclasses.replace(cfg.model, lora=None))
    peft_config = peft_lora_config(cfg.model.lora) if cfg.model.lora is not None else None

    # ------------------------------------------------------------------ train
    set_seed(cfg.run.seed)  # TRL initialises the adapter inside the constructor: same seed, same adapter
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_funcs,
        args=run.args,
        train_dataset=train_dataset,
        processing_class=processor,
        peft_config=peft_config,
    )
    same_keys_in_wandb(trainer)  # W&B keys = log_history keys (gap/abs, not train/gap/abs)
    trainer.add_callback(CheckpointCallback.resuming(None, run.resume))
    train(trainer, run.resume)

    # ------------------------------------------------------------------ save
    # With LoRA this is the adapter (adapter_config.json names the starting model); without, the full model.
    save_final(trainer, processor, run)


if __name__ == "__main__":
    run_recipe(main, GRPORecipeConfig)  # errors: one line and an exit status, as tokenswap.cli.main gives them
