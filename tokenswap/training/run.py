"""A run's two ends, shared by the four recipes: :func:`start_run` before any data loads, :func:`save_final` after
training. What lies between (data, model, trainer) is the recipe's own and stays in the recipe file.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from tokenswap.config import config_to_dict
from tokenswap.files import atomic_write_json
from tokenswap.ranks import print0, rank_and_world
from tokenswap.training.checkpoint import resolve_checkpoint, saving_final
from tokenswap.training.config import CollatorConfig, GapEvalConfig
from tokenswap.training.distributed import close_process_group
from tokenswap.training.model import check_inputs
from tokenswap.training.run_folder import check_resume_settings, hold_output_dir, write_run_config
from tokenswap.training.tracking import finish_wandb, init_wandb
from tokenswap.training.trainer_args import build_training_arguments

__all__ = ["Run", "save_final", "start_run"]


@dataclass(frozen=True)
class Run:
    """What the setup decided, read by the rest of the recipe."""

    stage: str
    """The recipe's name in its log lines and W&B config (``post_train``, ``image_sft``, ...)."""
    output_dir: str
    args: Any
    """The Trainer's arguments (``TrainingArguments`` or TRL's ``GRPOConfig``)."""
    resume: str | None
    """The checkpoint this run continues from, or None for a fresh start."""
    rank: int

    @property
    def device(self) -> str | None:
        """``cpu`` when the run trains on CPU, else None (CUDA when available)."""
        return "cpu" if self.args.use_cpu else None

    def path(self, name: str) -> str:
        return os.path.join(self.output_dir, name)


def start_run(
    cfg,
    *,
    stage: str,
    collator: CollatorConfig | None = None,
    image_store: str | None = None,
    paths: dict[str, str | None] | None = None,
    gap_eval: GapEvalConfig | None = None,
    **recipe_arguments: Any,
) -> Run:
    """Everything a run does before its data loads, in the order it must happen.

    The run folder made; the Trainer's arguments built (process state first: gloo, DeepSpeed; ``recipe_arguments``
    are the values the recipe owns, e.g. ``train_sampling_strategy``); the inputs checked before anything loads
    (:func:`~tokenswap.training.model.check_inputs`: exit 2 with every problem); the folder held (a second run in
    it exits 1 naming the holder); the checkpoint to resume from found and its settings compared with these (exit
    2, each difference named); the run's config written; the W&B run started.

    Args:
        cfg: the recipe's config, with ``run``, ``model``, ``train`` and ``wandb`` sections.
        stage: the recipe's name, as W&B and the log lines show it.
        collator, image_store, paths, gap_eval: what :func:`check_inputs` checks besides the model (``paths``:
            config key -> path; ``image_store`` only where the run reads one).
    """
    os.makedirs(cfg.run.output_dir, exist_ok=True)
    args = build_training_arguments(cfg.train, cfg.run, **recipe_arguments)
    check_inputs(cfg.model, packing=collator is not None and collator.packing, image_store=image_store, paths=paths,
                 device="cpu" if args.use_cpu else None, collator=collator, args=args, gap_eval=gap_eval)
    rank, _ = rank_and_world()
    hold_output_dir(cfg.run.output_dir, args)  # one run per folder: a second one exits 1 naming the holder
    resume = resolve_checkpoint(cfg.run.output_dir, cfg.train.resume_from_checkpoint)
    settings = config_to_dict(cfg)
    check_resume_settings(settings, resume)  # changed settings: exit 2, each difference named
    write_run_config(cfg.run.output_dir, settings)
    init_wandb(cfg.wandb, cfg.run, stage=stage, config=settings, report_to=args.report_to)
    return Run(stage=stage, output_dir=cfg.run.output_dir, args=args, resume=resume, rank=rank)


def save_final(
    trainer,
    processor,
    run: Run,
    *,
    stats: Mapping[str, Mapping] | None = None,
    merge_lora: bool = False,
    evaluate: Callable[[], None] | None = None,
) -> None:
    """Everything a run does after training: the model, the processor and the run's JSON files saved, W&B
    finished, an optional evaluation of the saved model on rank 0, and the process group closed.

    A failed write is one line naming the file and the free space (exit 1, :func:`saving_final`). Rank 0 writes
    ``log_history.json`` (read by ``tokenswap compare``) and each ``stats`` entry (file name -> counts) atomically.

    Args:
        merge_lora: save the trained adapter in ``adapter/`` and the LoRA-merged model in the run folder (rank 0),
            so the next stage and the evaluation load it as a plain checkpoint; otherwise ``save_model`` as is
            (with LoRA: the adapter alone).
        evaluate: run on rank 0 once the model is saved (a held-out evaluation of the run folder).
    """
    with saving_final(trainer):  # a full disk: exit 1 naming the file and the free space
        if not merge_lora:
            trainer.save_model(run.output_dir)
        else:
            trainer.save_model(run.path("adapter"))
            if trainer.is_world_process_zero():
                trainer.model.merge_and_unload().save_pretrained(run.output_dir)
        if trainer.is_world_process_zero():
            processor.save_pretrained(run.output_dir)
            for name, counts in (stats or {}).items():
                atomic_write_json(run.path(name), dict(counts))
            atomic_write_json(run.path("log_history.json"), trainer.state.log_history)
    finish_wandb()
    if evaluate is not None:
        print0(f"[{run.stage}] saved: {run.output_dir}")
        if trainer.is_world_process_zero():
            evaluate()
    print0(f"[{run.stage}] done: {run.output_dir}")
    close_process_group()
