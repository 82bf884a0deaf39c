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

import json
import os
from dataclasses import dataclass, field

import torch
from accelerate import PartialState
from transformers import Trainer, TrainingArguments

from tokenswap.config import config_to_dict, parse_config
from tokenswap.crossmath import load_crossmath
from tokenswap.crossmath.cli import cli_main as crossmath_cli
from tokenswap.crossmath.training_data import (
    CrossMathDataConfig,
    crossmath_source,
    load_training_records,
    sft_example,
)
from tokenswap.training import (
    CollatorConfig,
    ModelConfig,
    RunConfig,
    TrainConfig,
    WandbConfig,
    build_collator,
    finish_wandb,
    init_wandb,
    load_model_and_processor,
    print0,
)


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
    """Only `max_length`, `dummy_image` and `cache_gb` matter: nothing is swapped."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """Optimizer, schedule, precision, DeepSpeed, checkpoints."""
    merge_lora: bool = True
    """Save the LoRA-merged full model in run.output_dir (and the adapter in adapter/), so GRPO and eval load it."""
    eval: CrossMathEvalConfig | None = None
    """Held-out CrossMath metrics in image modality after training (rank 0); None skips it."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Run naming: {pair}-{arm} in group {pair}."""

    def __post_init__(self) -> None:
        if self.run.arm != "text":
            raise ValueError(f"CrossMath SFT swaps no concepts: set `run.arm: text`, got {self.run.arm!r}")
        if self.eval is not None and self.model.lora is not None and not self.merge_lora:
            raise ValueError("`eval` loads the saved model, which LoRA leaves adapter-only: set `merge_lora: true`")


def main(cfg: ImageSFTConfig) -> None:
    # ------------------------------------------------------------------ setup
    os.makedirs(cfg.run.output_dir, exist_ok=True)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    accelerator_config = None
    if cfg.train.deepspeed:
        # Before any PartialState exists, so the process state is built for DeepSpeed.
        os.environ.setdefault("ACCELERATE_USE_DEEPSPEED", "true")
    if world > 1 and (cfg.train.use_cpu or not torch.cuda.is_available()):
        # CPU ranks talk over gloo; the Trainer must reuse this state instead of building its own.
        PartialState(cpu=not cfg.train.deepspeed, backend="gloo")
        accelerator_config = {"use_configured_state": True}
    rank = int(os.environ.get("RANK", "0"))
    args = TrainingArguments(
        output_dir=cfg.run.output_dir,
        run_name=f"{cfg.run.pair}-{cfg.run.arm}",
        seed=cfg.run.seed,
        per_device_train_batch_size=cfg.train.per_device_train_batch_size,
        gradient_accumulation_steps=cfg.train.gradient_accumulation_steps,
        learning_rate=cfg.train.learning_rate,
        lr_scheduler_type=cfg.train.lr_scheduler_type,
        warmup_steps=cfg.train.warmup_steps,
        weight_decay=cfg.train.weight_decay,
        num_train_epochs=cfg.train.num_train_epochs,
        max_steps=cfg.train.max_steps,
        bf16=cfg.train.bf16,
        activation_checkpointing=cfg.train.gradient_checkpointing,
        deepspeed=cfg.train.deepspeed,
        logging_steps=cfg.train.logging_steps,
        save_steps=cfg.train.save_steps,
        save_total_limit=cfg.train.save_total_limit,
        dataloader_num_workers=cfg.train.dataloader_num_workers,
        report_to=cfg.train.report_to,
        use_cpu=cfg.train.use_cpu,
        accelerator_config=accelerator_config,
        # The collator reads id/messages/images; the model never sees dataset columns.
        remove_unused_columns=False,
        save_only_model=False,
    )
    if rank == 0:
        with open(os.path.join(cfg.run.output_dir, "tokenswap_config.json"), "w") as f:
            json.dump(config_to_dict(cfg), f, indent=2)
    init_wandb(cfg.wandb, cfg.run, stage="image_sft", config=config_to_dict(cfg), report_to=cfg.train.report_to)

    # ------------------------------------------------------------------ data, collator
    # Rank 0 generates and renders the puzzles; the other ranks then find them on disk.
    with args.main_process_first(desc="crossmath data"):
        records = load_training_records(cfg.data, os.path.join(cfg.run.output_dir, "train_data"))
    # Solving every puzzle here fails fast on a record the hop solver cannot finish, before any model loads.
    train_dataset = [sft_example(record) for record in records]
    print0(f"[image_sft] {cfg.run.pair}: {len(train_dataset)} puzzles ({cfg.data.style} style)")

    # ------------------------------------------------------------------ model (after TrainingArguments: ZeRO-3 init)
    model, processor = load_model_and_processor(cfg.model)
    collator = build_collator(cfg.collator, processor, None, cfg.run.arm, learn="assistant")
    collator.log_ids_to = os.path.join(cfg.run.output_dir, f"sample_ids.rank{rank}.txt")

    # ------------------------------------------------------------------ train
    trainer = Trainer(
        model=model,
        args=args,
        train_dataset=train_dataset,
        data_collator=collator,
        processing_class=processor,
    )
    resume = cfg.train.resume_from_checkpoint
    trainer.train(resume_from_checkpoint=True if resume == "latest" else resume)

    # ------------------------------------------------------------------ save
    if cfg.model.lora is None or not cfg.merge_lora:
        trainer.save_model(cfg.run.output_dir)
    else:
        trainer.save_model(os.path.join(cfg.run.output_dir, "adapter"))
        if trainer.is_world_process_zero():
            # Merged weights load as a plain checkpoint: GRPO puts a fresh adapter on them, eval reads them as is.
            trainer.model.merge_and_unload().save_pretrained(cfg.run.output_dir)
    if trainer.is_world_process_zero():
        processor.save_pretrained(cfg.run.output_dir)
        with open(os.path.join(cfg.run.output_dir, "collator_stats.json"), "w") as f:
            json.dump(dict(collator.stats), f, indent=2)
        with open(os.path.join(cfg.run.output_dir, "log_history.json"), "w") as f:
            json.dump(trainer.state.log_history, f, indent=2)
    finish_wandb()
    print0(f"[image_sft] saved: {cfg.run.output_dir}")

    # ------------------------------------------------------------------ held-out eval (image modality, rank 0)
    if cfg.eval is not None and trainer.is_world_process_zero():
        heldout = crossmath_source(cfg.eval.data, os.path.join(cfg.run.output_dir, "eval_data"))
        seen = {record["markdown_table"] for record in records}
        overlap = [r["id"] for r in load_crossmath(heldout)[: cfg.eval.data.limit] if r["markdown_table"] in seen]
        if overlap:
            raise ValueError(f"eval puzzles {overlap[:5]} are also training puzzles; give eval.data another seed")
        argv = ["eval", "--model", cfg.run.output_dir, "--data", str(heldout), "--modality", "image"]
        argv += ["--max-new-tokens", str(cfg.eval.max_new_tokens), "--batch-size", str(cfg.eval.batch_size)]
        argv += ["--out", os.path.join(cfg.run.output_dir, "eval")]
        if cfg.eval.data.limit is not None:
            argv += ["--n", str(cfg.eval.data.limit)]
        status = crossmath_cli(argv)
        if status != 0:
            raise RuntimeError(f"tokenswap crossmath {' '.join(argv)} exited with {status}")
    print0(f"[image_sft] done: {cfg.run.output_dir}")


if __name__ == "__main__":
    main(parse_config(ImageSFTConfig))
