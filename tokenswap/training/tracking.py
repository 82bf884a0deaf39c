"""W&B run set-up: one run per arm, named ``{pair}-{arm}`` in group ``{pair}``, so paired runs compare."""

from __future__ import annotations

import os
import sys

from tokenswap.training.config import RunConfig, WandbConfig


def init_wandb(cfg: WandbConfig, run: RunConfig, stage: str, config: dict, report_to: list[str]) -> None:
    """Start the W&B run of one arm on rank 0: name ``{pair}-{arm}``, group ``{pair}``.

    The Trainer's W&B callback then logs into this run instead of opening its own.
    """
    if "wandb" not in report_to or int(os.environ.get("RANK", "0")) != 0:
        return
    import wandb

    wandb.init(
        project=cfg.project,
        entity=cfg.entity,
        name=f"{run.pair}-{run.arm}",
        group=run.pair,
        job_type=stage,
        tags=[stage, run.arm, run.image_source, *cfg.tags],
        config={"arm": run.arm, "image_source": run.image_source, "stage": stage, "pair": run.pair, **config},
        mode=cfg.mode,
        dir=run.output_dir,
    )


def finish_wandb() -> None:
    """Close the W&B run opened by :func:`init_wandb` (flushes offline run files)."""

    if "wandb" in sys.modules and sys.modules["wandb"].run is not None:
        sys.modules["wandb"].finish()
