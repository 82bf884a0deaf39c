"""Image-only SFT of Qwen2-VL on CrossMath: the puzzle is shown only as an image, the target verbalises
the hop solver's rounds and ends in ``<answer>…</answer>`` (CrossMath paper §SFT, SPECS §1.9).

    # puzzles once (or leave data.path unset to generate data.n puzzles into the run folder)
    tokenswap crossmath generate --n 5000 --seed 0 --difficulty mixed --out data/crossmath_train --styles original

    # LoRA r=16 on 8 GPUs (ZeRO-2: LoRA parameters fit on every GPU, and the adapter is merged on rank 0)
    accelerate launch --config_file configs/accelerate/zero2.yaml recipes/image_sft.py --config image_sft_crossmath.yaml

    # dotted overrides
    accelerate launch --config_file configs/accelerate/zero2.yaml recipes/image_sft.py \\
        --config image_sft_crossmath.yaml data.path=data/crossmath_train train.num_train_epochs=1

    # tiny CPU run (tests, demo); the first line writes .cache/tiny-qwen2vl once
    python -m tokenswap.testing .cache
    python recipes/image_sft.py --config tiny/image_sft_crossmath.yaml

The run folder then holds the merged model + processor (the starting point of ``recipes/grpo.py``),
the adapter in ``adapter/``, and with ``eval`` set, ``eval/metrics_image.{json,md}`` from
``tokenswap crossmath eval`` on held-out puzzles.
"""

from __future__ import annotations

import tokenswap.start  # noqa: F401 -- first: a command-line secret refused, the streams redacting before imports print

# ruff: noqa: E402 -- the train extra is checked before the imports that need it
from tokenswap.script import require_extra

require_extra("train", "recipes/image_sft.py")  # a package missing: one line naming the extra, exit status 2

# isort: split
from dataclasses import dataclass, field

from tokenswap.crossmath.training_data import (
    CrossMathDataConfig,
    crossmath_source,
    load_training_records,
    sft_example,
)
from tokenswap.errors import InputError
from tokenswap.training.config import CollatorConfig, ModelConfig, RunConfig, ThroughputConfig, WandbConfig
from tokenswap.training.entry import run_recipe
from tokenswap.training.trainer_args import TrainConfig


@dataclass(kw_only=True)
class CrossMathEvalConfig:
    data: CrossMathDataConfig
    """Held-out puzzles (generated ones need a seed other than the training data's); `limit` caps them."""
    max_new_tokens: int = 4096
    """Greedy decoding budget per puzzle; the chain of thought of a 13x13 puzzle is ~1-2k tokens."""
    batch_size: int = 8
    """Puzzles per generate call."""


@dataclass(kw_only=True)
class ImageSFTConfig:
    run: RunConfig
    """Output folder and W&B naming; `arm` must be text (the collator swaps no concepts here)."""
    model: ModelConfig
    """Base checkpoint (an Instruct model) and what is trained; `lora` r=16 in the paper."""
    data: CrossMathDataConfig = field(default_factory=CrossMathDataConfig)
    """Training puzzles: a `tokenswap crossmath generate` folder, or generated on the fly."""
    collator: CollatorConfig = field(default_factory=CollatorConfig)
    """Nothing is swapped: the swap-only keys (`swap_prob`, `max_images`, `resample_each_epoch`, `swap_seed`,
    `prepared`) have no effect here, and setting one is a config error. Every other key applies to the puzzle
    images and samples; `group_by_length` orders the puzzles by length, seeded by data.seed, and the Trainer then
    reads that order sequentially, the same every epoch (instead of reshuffling each epoch)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Every `TrainingArguments` field (optimizer, schedule, precision, DeepSpeed, checkpoints, hub, liger, ...);
    `resume_from_checkpoint: latest` resumes from the newest complete checkpoint in run.output_dir."""
    merge_lora: bool = True
    """Save the LoRA-merged full model in run.output_dir (and the adapter in adapter/), so GRPO and eval load it."""
    eval: CrossMathEvalConfig | None = None
    """Held-out CrossMath metrics in image modality after training (rank 0); None skips it."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Run naming: {pair}-{arm}-s{seed} in group {pair}."""
    throughput: ThroughputConfig = field(default_factory=ThroughputConfig)
    """perf/* log keys: tokens/s, images/s, padding, TFLOP/s, MFU (peak_tflops overrides the GPU table)."""

    def __post_init__(self) -> None:
        problems = []
        if self.run.arm != "text":
            problems.append(f"CrossMath SFT swaps no concepts: set `run.arm: text`, got {self.run.arm!r}")
        if self.eval is not None and self.model.lora is not None and not self.merge_lora:
            problems.append("`eval` loads the saved model, which LoRA leaves adapter-only: set `merge_lora: true`")
        for name in self.collator.swap_only_set():
            problems.append(
                f"`collator.{name}` has no effect in image SFT (no concept is swapped: arm text, no image store); "
                "remove it"
            )
        if self.train.train_sampling_strategy in ("group_by_length", "batch_rebalance"):
            # The Trainer's length samplers read each example's `input_ids`; the collator tokenizes on the fly,
            # so the Trainer would stop at its first step with "Can only automatically infer lengths ...".
            problems.append(
                f"`train.train_sampling_strategy: {self.train.train_sampling_strategy}` needs tokenized examples, "
                "which image SFT makes in the collator: remove it and set `collator.group_by_length: true` (the "
                "same grouping from the puzzles' text lengths)"
            )
        if problems:
            raise ValueError("; ".join(problems))


def main(cfg: ImageSFTConfig) -> None:
    # What trains is imported here, once run_recipe has parsed the config: a typo is answered before torch,
    # transformers and peft load (seconds).
    from transformers import Trainer

    from tokenswap.attention import use_packed_attention
    from tokenswap.crossmath import load_crossmath
    from tokenswap.crossmath.cli import evaluate as evaluate_crossmath
    from tokenswap.packing import group_by_length
    from tokenswap.ranks import print0
    from tokenswap.throughput import ThroughputCallback
    from tokenswap.training.builders import build_collator
    from tokenswap.training.callbacks import EmptyStepCallback, install_first
    from tokenswap.training.checkpoint import CheckpointCallback, ResumableCollator, train
    from tokenswap.training.model import load_model_and_processor
    from tokenswap.training.run import save_final, start_run
    from tokenswap.training.tracking import same_keys_in_wandb

    # ------------------------------------------------------------------ setup (process state before anything else)
    run = start_run(
        cfg,
        stage="image_sft",
        collator=cfg.collator,
        # "random" is the default (an explicit one cannot be told apart): the grouped order is read as is.
        **({"train_sampling_strategy": "sequential"} if cfg.collator.group_by_length else {}),
    )
    args, resume = run.args, run.resume

    # ------------------------------------------------------------------ data, collator
    # Rank 0 generates and renders the puzzles; the other ranks then find them on disk.
    with args.main_process_first(desc="crossmath data"):
        records = load_training_records(cfg.data, run.path("train_data"))
    # Solving every puzzle here fails fast on a record the hop solver cannot finish, before any model loads.
    train_dataset = [sft_example(record) for record in records]
    if cfg.collator.group_by_length:  # read sequentially (see start_run above)
        train_dataset = group_by_length(train_dataset, args.per_device_train_batch_size, cfg.data.seed)
    print0(f"[image_sft] {cfg.run.pair}: {len(train_dataset)} puzzles ({cfg.data.style} style)")
    heldout = None
    if cfg.eval is not None:
        # The held-out puzzles are known now: one that is also a training puzzle is refused before any model loads
        # (every rank checks, so all of them stop), not after the whole training run.
        with args.main_process_first(desc="crossmath eval data"):
            heldout = crossmath_source(cfg.eval.data, run.path("eval_data"))
        seen = {record["markdown_table"] for record in records}
        overlap = [r["id"] for r in load_crossmath(heldout)[: cfg.eval.data.limit] if r["markdown_table"] in seen]
        if overlap:
            raise InputError(f"eval puzzles {overlap[:5]} are also training puzzles; give eval.data another seed")

    # ------------------------------------------------------------------ model (after TrainingArguments: ZeRO-3 init)
    model, processor = load_model_and_processor(cfg.model, resume_from=resume, seed=cfg.run.seed)
    if cfg.collator.packing:
        use_packed_attention(model, cfg.model.attn_implementation, device=run.device)
    collator = build_collator(cfg.collator, processor, None, cfg.run.arm, learn="assistant")
    resumable = ResumableCollator(collator, log_ids_to=run.path(f"sample_ids.rank{run.rank}.txt"))

    # ------------------------------------------------------------------ train
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        data_collator=resumable,
        processing_class=processor,
        callbacks=[CheckpointCallback.resuming(resumable, resume)],
    )
    same_keys_in_wandb(trainer)  # W&B keys = log_history keys (gap/abs, not train/gap/abs)
    trainer.add_callback(EmptyStepCallback(model, cfg.collator.max_empty_step_share, resumable))
    if cfg.throughput.enabled:
        install_first(trainer, ThroughputCallback(resumable, cfg.throughput.peak_tflops))
    train(trainer, resume)

    # ------------------------------------------------------------------ save, then the held-out eval (image, rank 0)
    def evaluate_heldout() -> None:
        evaluate_crossmath(run.output_dir, str(heldout), "image", run.path("eval"), n=cfg.eval.data.limit,
                           max_new_tokens=cfg.eval.max_new_tokens, batch_size=cfg.eval.batch_size)

    # Merged weights load as a plain checkpoint: GRPO puts a fresh adapter on them, eval reads them as is.
    save_final(
        trainer,
        processor,
        run,
        stats={"collator_stats.json": resumable.stats},
        merge_lora=cfg.model.lora is not None and cfg.merge_lora,
        evaluate=evaluate_heldout if heldout is not None else None,
    )


if __name__ == "__main__":
    run_recipe(main, ImageSFTConfig)  # errors: one line and an exit status, as tokenswap.cli.main gives them
