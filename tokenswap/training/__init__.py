"""What the training recipes share, one module per concern (no training loop here).

::

    training/
      config.py        the config sections: run, model, LoRA, collator, data, gap evaluation, W&B
      trainer_args.py  the Trainer pass-through: every TrainingArguments / GRPOConfig field from YAML
      model.py         checks before anything loads (check_inputs), then weights, quantization, LoRA, attention
      checkpoint.py    complete checkpoints, exact resume, the collator bookkeeping that travels with batches, train()
      run_folder.py    one run per output folder (a lock), resume settings checked, the run's config written
      callbacks.py     swap epochs, swap statistics, the stop for steps with no target
      builders.py      config section in, library object out: image store, collator, gap callback
      tracking.py      W&B runs named {pair}-{arm}-s{seed} in group {pair}
      distributed.py   agree across the ranks (any_rank); end a multi-process run cleanly (print0 lives in
                       tokenswap/ranks.py and is re-exported here)
      workers.py       data-loader workers that outlive a job's SIGTERM and end with the run
      entry.py         run_recipe: a recipe's __main__, its errors mapped as tokenswap.cli.main maps them

Recipes import from the module of each concern; every name is also importable from ``tokenswap.training``.
"""

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
    "saving_final",
    "train",
    "trainer_section",
    "verify_checkpoint",
    "write_run_config",
]
