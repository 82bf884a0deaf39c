"""Continued pre-training of Qwen2-VL on Magpie samples as text or as TokenSwap (paired arms).

Every text token of the conversation is learned (user and assistant; image tokens never are).
Reproduces the TokenSwap paper's continued pre-training comparison (Qwen2-VL-7B, 8xA100):

    accelerate launch --config_file configs/accelerate/zero3_8xa100.yaml recipes/pretrain.py --config pretrain_text.yaml
    accelerate launch --config_file configs/accelerate/zero3_8xa100.yaml recipes/pretrain.py --config pretrain_generate.yaml
    accelerate launch --config_file configs/accelerate/zero3_8xa100.yaml recipes/pretrain.py --config pretrain_retrieve.yaml

    # tiny CPU run (tests, demo)
    python recipes/pretrain.py --config tiny/pretrain_tokenswap.yaml

Then `tokenswap compare --runs outputs/pretrain_text outputs/pretrain_generate` puts the arms side by side.
"""

from __future__ import annotations

import tokenswap.start  # noqa: F401 -- first: a command-line secret refused, the streams redacting before imports print

# ruff: noqa: E402 -- the train extra is checked before the imports that need it
from tokenswap.script import require_extra

require_extra("train", "recipes/pretrain.py")  # a package missing: one line naming the extra, exit status 2

# isort: split
from dataclasses import dataclass, field

from tokenswap.training.config import (
    CollatorConfig,
    DataConfig,
    GapEvalConfig,
    ModelConfig,
    RunConfig,
    ThroughputConfig,
    WandbConfig,
    resolve_replicate,
)
from tokenswap.training.entry import run_recipe
from tokenswap.training.trainer_args import PairedTrainConfig


@dataclass(kw_only=True)
class PretrainConfig:
    run: RunConfig
    """Output folder, pair name and arm."""
    model: ModelConfig
    """Base checkpoint and what is trained."""
    data: DataConfig
    """The Magpie swap dataset (llava_* keys must stay unset)."""
    image_store: str | None = None
    """Image store folder (tokenswap build-store); required for the tokenswap arm."""
    collator: CollatorConfig = field(default_factory=CollatorConfig)
    """Swap policy, token budget, ZeRO-3 dummy image."""
    train: PairedTrainConfig = field(default_factory=PairedTrainConfig)
    """Every `TrainingArguments` field (optimizer, schedule, precision, DeepSpeed, checkpoints, hub, liger, ...);
    `resume_from_checkpoint: latest` resumes from the newest complete checkpoint in run.output_dir."""
    gap_eval: GapEvalConfig = field(default_factory=GapEvalConfig)
    """In-loop modality-gap evaluation."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Run naming: {pair}-{arm}-s{seed} in group {pair}."""
    throughput: ThroughputConfig = field(default_factory=ThroughputConfig)
    """perf/* log keys: tokens/s, images/s, padding, TFLOP/s, MFU (peak_tflops overrides the GPU table)."""

    def __post_init__(self) -> None:
        resolve_replicate(self.run, self.data, self.collator)
        if self.run.arm == "tokenswap" and self.image_store is None:
            raise ValueError("the tokenswap arm needs `image_store` (a folder built by `tokenswap build-store`)")
        if self.run.arm == "baseline":
            raise ValueError("continued pre-training has text and tokenswap arms; the baseline is the untouched model")
        if self.data.swap_dataset is None:
            raise ValueError(f"the {self.run.arm} arm needs `data.swap_dataset` (the Magpie swap dataset)")
        if self.data.llava_json is not None:
            raise ValueError("continued pre-training uses the Magpie swap dataset only; unset `data.llava_json`")


def main(cfg: PretrainConfig) -> None:
    # What trains is imported here, once run_recipe has parsed the config: a typo is answered before torch,
    # transformers and peft load (seconds).
    from transformers import Trainer

    from tokenswap.attention import use_packed_attention
    from tokenswap.data.mixture import paired_mixture
    from tokenswap.data.schema import load_samples
    from tokenswap.packing import group_by_length
    from tokenswap.ranks import print0
    from tokenswap.throughput import ThroughputCallback
    from tokenswap.training.builders import build_collator, build_gap_callback, build_image_store
    from tokenswap.training.callbacks import EmptyStepCallback, EpochCallback, SwapStatsCallback, install_first
    from tokenswap.training.checkpoint import CheckpointCallback, ResumableCollator, train
    from tokenswap.training.model import load_model_and_processor
    from tokenswap.training.run import save_final, start_run
    from tokenswap.training.tracking import same_keys_in_wandb

    # ------------------------------------------------------------------ setup (process state before anything else)
    # paired_mixture already fixed a seeded order shared by the arms of a pair.
    run = start_run(
        cfg,
        stage="pretrain",
        collator=cfg.collator,
        image_store=cfg.image_store if cfg.run.arm == "tokenswap" else None,
        paths={f"data.{k}": getattr(cfg.data, k) for k in ("llava_image_root", "swap_dataset")},
        gap_eval=cfg.gap_eval,
        train_sampling_strategy="sequential",
    )
    args, resume = run.args, run.resume

    # ------------------------------------------------------------------ data, image store, collator
    swap = load_samples(cfg.data.swap_dataset, cfg.data.swap_limit)
    train_dataset = paired_mixture(cfg.run.arm, None, swap, seed=cfg.data.seed)
    if cfg.collator.group_by_length:  # text-arm lengths and data.seed: the arms of a pair keep one order
        train_dataset = group_by_length(train_dataset, args.per_device_train_batch_size, cfg.data.seed)
    print0(f"[pretrain] {cfg.run.pair}-{cfg.run.arm}: {len(train_dataset)} samples")

    # ------------------------------------------------------------------ model (after TrainingArguments: ZeRO-3 init)
    model, processor = load_model_and_processor(cfg.model, resume_from=resume, seed=cfg.run.seed)
    if cfg.collator.packing:
        use_packed_attention(model, cfg.model.attn_implementation, device=run.device)
    store = build_image_store(cfg.image_store) if cfg.run.arm == "tokenswap" else None
    collator = build_collator(
        cfg.collator, processor, store, cfg.run.arm, learn="all", image_root=cfg.data.llava_image_root
    )
    resumable = ResumableCollator(collator, log_ids_to=run.path(f"sample_ids.rank{run.rank}.txt"))

    # ------------------------------------------------------------------ train
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        data_collator=resumable,
        processing_class=processor,
        callbacks=[EpochCallback(collator), CheckpointCallback.resuming(resumable, resume)],
    )
    same_keys_in_wandb(trainer)  # W&B keys = log_history keys (gap/abs, not train/gap/abs)
    install_first(trainer, SwapStatsCallback(resumable))
    trainer.add_callback(EmptyStepCallback(model, cfg.collator.max_empty_step_share, resumable))
    if cfg.throughput.enabled:
        install_first(trainer, ThroughputCallback(resumable, cfg.throughput.peak_tflops))
    gap_callback = build_gap_callback(cfg.gap_eval, processor, trainer)
    if gap_callback is not None:
        trainer.add_callback(gap_callback)
    train(trainer, resume)

    # ------------------------------------------------------------------ save
    save_final(trainer, processor, run, stats={"swap_stats.json": resumable.stats})


if __name__ == "__main__":
    run_recipe(main, PretrainConfig)  # errors: one line and an exit status, as tokenswap.cli.main gives them
