"""What the training recipes share, one module per concern (no training loop here).

::

    training/
      config.py        the config sections: run, model, LoRA, collator, data, gap evaluation, W&B
      trainer_args.py  the Trainer pass-through: every TrainingArguments / GRPOConfig field from YAML
      model.py         checks before anything loads (check_inputs), then weights, quantization, LoRA, attention
      checkpoint.py    complete checkpoints, exact resume, the collator bookkeeping that travels with batches, train()
      run_folder.py    one run per output folder (a lock), resume settings checked, the run's config written
      run.py           a run's two ends, one call each: start_run (the setup above, in order) and save_final
      callbacks.py     swap epochs, swap statistics, the stop for steps with no target
      builders.py      config section in, library object out: image store, collator, gap callback
      tracking.py      W&B runs named {pair}-{arm}-s{seed} in group {pair}
      distributed.py   agree across the ranks (any_rank); end a multi-process run cleanly (print0 lives in
                       tokenswap/ranks.py and is re-exported here)
      workers.py       data-loader workers that outlive a job's SIGTERM and end with the run
      entry.py         run_recipe: a recipe's __main__, its errors mapped as tokenswap.cli.main maps them

Recipes import from the module of each concern; every name is also importable from ``tokenswap.training``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from tokenswap.lazy import lazy_exports

# Lazy (PEP 562): a module that needs one concern loads only that concern's imports (trl, deepspeed, wandb
# load with the modules that use them). Every name below still imports from here.
_EXPORTS = {
    "print0": "tokenswap.ranks",
    "build_collator": "tokenswap.training.builders",
    "build_gap_callback": "tokenswap.training.builders",
    "build_image_store": "tokenswap.training.builders",
    "EmptyStepCallback": "tokenswap.training.callbacks",
    "EpochCallback": "tokenswap.training.callbacks",
    "NoTargetsError": "tokenswap.training.callbacks",
    "SwapStatsCallback": "tokenswap.training.callbacks",
    "install_first": "tokenswap.training.callbacks",
    "BOOKKEEPING_KEY": "tokenswap.training.checkpoint",
    "COMPLETE_MARKER": "tokenswap.training.checkpoint",
    "PREEMPTED_EXIT": "tokenswap.training.checkpoint",
    "CheckpointCallback": "tokenswap.training.checkpoint",
    "ResumableCollator": "tokenswap.training.checkpoint",
    "resolve_checkpoint": "tokenswap.training.checkpoint",
    "saving_final": "tokenswap.training.checkpoint",
    "train": "tokenswap.training.checkpoint",
    "verify_checkpoint": "tokenswap.training.checkpoint",
    "CollatorConfig": "tokenswap.training.config",
    "DataConfig": "tokenswap.training.config",
    "GapEvalConfig": "tokenswap.training.config",
    "LoraConfig": "tokenswap.training.config",
    "ModelConfig": "tokenswap.training.config",
    "RunConfig": "tokenswap.training.config",
    "WandbConfig": "tokenswap.training.config",
    "at_script_end": "tokenswap.training.distributed",
    "close_process_group": "tokenswap.training.distributed",
    "end_script": "tokenswap.training.distributed",
    "run_recipe": "tokenswap.training.entry",
    "check_inputs": "tokenswap.training.model",
    "load_model_and_processor": "tokenswap.training.model",
    "model_family": "tokenswap.training.model",
    "peft_lora_config": "tokenswap.training.model",
    "resolve_attn_implementation": "tokenswap.training.model",
    "Run": "tokenswap.training.run",
    "save_final": "tokenswap.training.run",
    "start_run": "tokenswap.training.run",
    "RESUME_MAY_CHANGE": "tokenswap.training.run_folder",
    "RunLockedError": "tokenswap.training.run_folder",
    "check_resume_settings": "tokenswap.training.run_folder",
    "hold_output_dir": "tokenswap.training.run_folder",
    "write_run_config": "tokenswap.training.run_folder",
    "finish_wandb": "tokenswap.training.tracking",
    "init_wandb": "tokenswap.training.tracking",
    "PAIRED_OWNED": "tokenswap.training.trainer_args",
    "TRAIN_DEFAULTS": "tokenswap.training.trainer_args",
    "TRAINER_OWNED": "tokenswap.training.trainer_args",
    "PairedTrainConfig": "tokenswap.training.trainer_args",
    "TrainConfig": "tokenswap.training.trainer_args",
    "build_training_arguments": "tokenswap.training.trainer_args",
    "trainer_section": "tokenswap.training.trainer_args",
}

__all__ = [
    "BOOKKEEPING_KEY",
    "COMPLETE_MARKER",
    "CheckpointCallback",
    "CollatorConfig",
    "DataConfig",
    "EmptyStepCallback",
    "EpochCallback",
    "GapEvalConfig",
    "LoraConfig",
    "ModelConfig",
    "NoTargetsError",
    "PAIRED_OWNED",
    "PREEMPTED_EXIT",
    "RESUME_MAY_CHANGE",
    "Run",
    "RunLockedError",
    "PairedTrainConfig",
    "ResumableCollator",
    "RunConfig",
    "SwapStatsCallback",
    "TRAINER_OWNED",
    "TRAIN_DEFAULTS",
    "TrainConfig",
    "WandbConfig",
    "at_script_end",
    "build_collator",
    "build_gap_callback",
    "build_image_store",
    "build_training_arguments",
    "check_inputs",
    "check_resume_settings",
    "close_process_group",
    "end_script",
    "finish_wandb",
    "hold_output_dir",
    "init_wandb",
    "install_first",
    "load_model_and_processor",
    "model_family",
    "peft_lora_config",
    "print0",
    "resolve_attn_implementation",
    "resolve_checkpoint",
    "run_recipe",
    "save_final",
    "saving_final",
    "start_run",
    "train",
    "trainer_section",
    "verify_checkpoint",
    "write_run_config",
]

if TYPE_CHECKING:
    from tokenswap.ranks import print0
    from tokenswap.training.builders import build_collator, build_gap_callback, build_image_store
    from tokenswap.training.callbacks import (
        EmptyStepCallback,
        EpochCallback,
        NoTargetsError,
        SwapStatsCallback,
        install_first,
    )
    from tokenswap.training.checkpoint import (
        BOOKKEEPING_KEY,
        COMPLETE_MARKER,
        PREEMPTED_EXIT,
        CheckpointCallback,
        ResumableCollator,
        resolve_checkpoint,
        saving_final,
        train,
        verify_checkpoint,
    )
    from tokenswap.training.config import (
        CollatorConfig,
        DataConfig,
        GapEvalConfig,
        LoraConfig,
        ModelConfig,
        RunConfig,
        WandbConfig,
    )
    from tokenswap.training.distributed import at_script_end, close_process_group, end_script
    from tokenswap.training.entry import run_recipe
    from tokenswap.training.model import (
        check_inputs,
        load_model_and_processor,
        model_family,
        peft_lora_config,
        resolve_attn_implementation,
    )
    from tokenswap.training.run import Run, save_final, start_run
    from tokenswap.training.run_folder import (
        RESUME_MAY_CHANGE,
        RunLockedError,
        check_resume_settings,
        hold_output_dir,
        write_run_config,
    )
    from tokenswap.training.tracking import finish_wandb, init_wandb
    from tokenswap.training.trainer_args import (
        PAIRED_OWNED,
        TRAIN_DEFAULTS,
        TRAINER_OWNED,
        PairedTrainConfig,
        TrainConfig,
        build_training_arguments,
        trainer_section,
    )


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
